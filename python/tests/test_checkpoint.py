"""Checkpoints: resumed at another world size and stage, consolidated by zero_to_fp32 and by
zero.utils.get_fp32_state_dict_from_zero_checkpoint into tensors that load into the model."""
import json
import subprocess

import pytest
import safetensors.torch
import torch

import cases
import harness
from conftest import MID_STEP, RESUMES
from harness import assert_bitwise, assert_close, assert_trained


@pytest.mark.parametrize("saved,loaded", RESUMES,
                         ids=[f"{m}-w{w}s{s}-to-w{lw}s{ls}" for (m, w, s), (lw, ls) in RESUMES])
def test_resume_at_another_world_size_and_stage_matches_an_uninterrupted_run(runs, saved, loaded):
    model, world, stage = saved
    load_world, load_stage = loaded
    saver = runs.train(model, world)
    loader = runs.launch(model, load_world)
    loader.require([f"resume-{load_stage}-fp32"])
    what = (f"{model}: saved on {world} ranks stage {stage} after {MID_STEP} steps, "
            f"resumed on {load_world} ranks stage {load_stage}")
    info = loader.info(load_stage, "fp32", resumed=True)
    assert info["client_state"] == {"step": MID_STEP}, what
    assert info["steps_after_load"] == MID_STEP, what
    assert info["global_steps"] == cases.STEPS, what
    resumed = loader.master(load_stage, "fp32", resumed=True)
    # Guard: the resumed run trained on from the weights it loaded (read back by the package).
    from zero.utils import get_fp32_state_dict_from_zero_checkpoint

    loaded_weights = get_fp32_state_dict_from_zero_checkpoint(str(saver.ckpt(stage, "fp32", mid=True)), tag="mid")
    assert_trained(resumed, {k: v.float() for k, v in loaded_weights.items()}, what + " (after loading)")
    assert_close(resumed, saver.master(stage, "fp32"), what + ", vs the uninterrupted run")
    assert_close(resumed, harness.reference_run(model)[0], what + ", vs AdamW")
    # The losses after resuming (averaged over ranks: the global batch's) are the second half's.
    resumed_losses = torch.tensor([loader.info(load_stage, "fp32", r, resumed=True)["losses"]
                                   for r in range(load_world)]).mean(0)
    saver_losses = torch.tensor([saver.info(stage, "fp32", r)["losses"][MID_STEP:] for r in range(world)]).mean(0)
    assert_close({"loss": resumed_losses}, {"loss": saver_losses}, what + " (losses)")


def load_into_model(model, tensors, what):
    """Loads tensors with strict=True into a fresh model; returns the model."""
    m = cases.build(model, seed=1234)
    try:
        m.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise AssertionError(f"{what}: load_state_dict(strict=True) refused it: {e}") from None
    for k, v in m.state_dict().items():
        assert torch.equal(v, tensors[k].to(v.dtype)), f"{what}: {k} did not load"
    return m


@pytest.mark.parametrize("world,stage,dtype", [(3, 3, "fp32"), (3, 3, "bf16"), (2, 0, "fp16"), (1, 2, "fp32")])
@pytest.mark.parametrize("model", ("mlp", "transformer"))
def test_zero_to_fp32_output_loads_into_the_model(runs, tmp_path, model, world, stage, dtype):
    tool = harness.zero_to_fp32_binary()
    assert tool, "zero_to_fp32 not built: set ZERO_TO_FP32 or BUILD_DIR (looked in build/tools and PATH)"
    run = runs.train(model, world)
    out = tmp_path / "model.safetensors"
    proc = subprocess.run([tool, str(run.ckpt(stage, dtype)), str(out), "--tag", "end"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"zero_to_fp32 exit {proc.returncode}: {proc.stderr}"
    what = f"zero_to_fp32 of {model}, {world} ranks, stage {stage} {dtype}"
    tensors = safetensors.torch.load_file(str(out))
    assert all(v.dtype == torch.float32 for v in tensors.values()), what
    # Tied parameters are stored once (as DeepSpeed's safetensors output stores shared tensors);
    # the file's "aliases" metadata maps each other name to the stored one.
    with safetensors.safe_open(str(out), "pt") as f:
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    if model == "transformer":
        assert aliases == {"lm_head.weight": "embed.weight"}, what + f": aliases {aliases}"
        assert "lm_head.weight" not in tensors, what + ": a tied tensor stored twice"
    for alias, name in aliases.items():
        tensors[alias] = tensors[name]
    expected = run.master(stage, dtype)  # get_fp32_state_dict_from_zero_checkpoint, same checkpoint
    assert_trained(expected, harness.initial_weights(model), what)
    load_into_model(model, tensors, what)
    assert_bitwise(tensors, expected, what + " vs get_fp32_state_dict_from_zero_checkpoint")


@pytest.mark.parametrize("model", ("mlp", "transformer"))
def test_fp32_state_dict_from_checkpoint_loads_into_the_model_tied_names_included(runs, model):
    run = runs.train(model, 3)
    sd = run.master(3, "fp32")
    what = f"get_fp32_state_dict_from_zero_checkpoint of {model}, 3 ranks, stage 3"
    assert sorted(sd) == sorted(cases.build(model).state_dict()), what
    if model == "transformer":
        assert torch.equal(sd["lm_head.weight"], sd["embed.weight"]), what + ": tied names differ"
    m = load_into_model(model, sd, what)
    if model == "transformer":
        assert m.lm_head.weight is m.embed.weight
    x, y = cases.global_batch(model, cases.STEPS)
    assert torch.isfinite(cases.loss_fn(model, m(x), y))
