"""zero.GatheredParameters(params, modifier_rank=M): rank M's new values become every rank's
parameters and master weights, at every stage, and training continues from them as AdamW does
when the values are replaced between two steps (its moments kept)."""
import json

import pytest
import torch

import cases
import harness
import worker_modify
from harness import assert_bitwise, assert_close, assert_trained

WORLD = 2
DTYPES = ("fp32", "bf16")


@pytest.fixture(scope="module")
def modified(tmp_path_factory):
    out = tmp_path_factory.mktemp("modify")
    launch = harness.torchrun(WORLD, "worker_modify.py", ["--out", out], timeout=600,
                              log=out / "torchrun.log")
    errors = [json.loads(p.read_text()) for p in sorted(out.glob("error.rank*.json"))]
    assert launch.returncode == 0 and not errors, (
        f"worker_modify.py: exit {launch.returncode}, errors {errors}\n{launch.tail()}")
    return out


def info(out, stage, dtype, rank):
    return json.loads((out / f"{stage}-{dtype}.rank{rank}.json").read_text())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stage", cases.STAGES)
def test_every_rank_sees_the_modifier_ranks_values(modified, stage, dtype):
    for rank in range(WORLD):
        got = info(modified, stage, dtype, rank)
        assert got["modifier"] == WORLD - 1
        # The replacement is exact in bf16, and the other rank wrote zeros: 0 means M's values.
        assert got["module_vs_replacement"] == 0, (stage, dtype, rank, got)
        assert got["master_vs_replacement"] == 0, (stage, dtype, rank, got)


def test_other_ranks_writes_do_not_reach_a_shared_model_copy(tmp_path):
    """The transformer's model copy at stages 1-3 is one for both processes (the shared model):
    inside GatheredParameters(modifier_rank=M) each rank still writes a copy of its own, so the
    other rank's zeros never reach the modifier's values, and every rank's parameters are the
    shared copy again after the context (training goes on through it)."""
    launch = harness.torchrun(WORLD, "worker_modify.py", ["--out", tmp_path, "--model", "transformer",
                                                         "--runs", "1:fp32,2:bf16,3:fp32"],
                              timeout=600, log=tmp_path / "torchrun.log")
    errors = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("error.rank*.json"))]
    assert launch.returncode == 0 and not errors, (
        f"worker_modify.py: exit {launch.returncode}, errors {errors}\n{launch.tail()}")
    for stage, dtype in ((1, "fp32"), (2, "bf16"), (3, "fp32")):
        for rank in range(WORLD):
            got = info(tmp_path, stage, dtype, rank)
            what = (stage, dtype, rank, got)
            assert got["shared_model_bytes"] > 0, what
            assert got["module_vs_replacement"] == 0, what
            assert got["master_vs_replacement"] == 0, what


def test_training_continues_from_them_as_adamw_does(modified):
    new = cases.replacement(worker_modify.MODEL)
    assert any(v.abs().sum() > 0 for v in new.values())
    ref, _ = cases.reference(worker_modify.MODEL, steps=worker_modify.STEPS,
                             replace=(worker_modify.MODIFY_AT, new))
    unmodified, _ = cases.reference(worker_modify.MODEL, steps=worker_modify.STEPS)
    # Guard: the replacement changes the result far beyond the tolerance.
    assert max(float((ref[k] - unmodified[k]).abs().max()) for k in ref) > 1e-2
    for stage in cases.STAGES:
        master = harness.load_st(modified / f"{stage}-fp32.master.safetensors")
        assert_trained(master, new, f"stage {stage} after the replacement")
        assert_close(master, ref, f"stage {stage} fp32, values replaced after step "
                     f"{worker_modify.MODIFY_AT}, vs AdamW")


@pytest.mark.parametrize("dtype", DTYPES)
def test_stages_stay_bitwise_equal(modified, dtype):
    stage0 = harness.load_st(modified / f"0-{dtype}.master.safetensors")
    for stage in (1, 2, 3):
        assert_bitwise(harness.load_st(modified / f"{stage}-{dtype}.master.safetensors"), stage0,
                       f"{dtype}: stage {stage} vs stage 0 after a replacement")


def test_a_modifier_rank_outside_the_world_is_refused():
    import zero

    model = cases.build("mlp")
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(),
                                      config=cases.config(0, "fp32", 1))
    try:
        p = next(engine.module.parameters())
        for bad in (1, -1, "0", True):
            with pytest.raises(zero.ZeroError, match="modifier_rank"):
                with zero.GatheredParameters(p, modifier_rank=bad):
                    pass
        # One rank: modifier_rank=0 keeps the change in the master weights.
        name = next(n for n, _ in engine.module.named_parameters())
        with zero.GatheredParameters(p, modifier_rank=0):
            with torch.no_grad():
                p.fill_(0.25)
        assert torch.equal(engine.gather_master(name), torch.full(p.shape, 0.25))
    finally:
        engine.close()
