"""Training through zero.initialize under torchrun on 1, 2 and 3 ranks: every stage x dtype of
each model comes from one launch (conftest.py), compared here with torch.optim.AdamW and with
each other."""
import pytest
import torch

import cases
import harness
from harness import assert_bitwise, assert_close, assert_trained

MODELS = ("mlp", "transformer")
WORLDS = (1, 2, 3)
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def test_package_exports_the_deepspeed_style_api():
    import zero
    import zero.utils

    assert issubclass(zero.ZeroError, RuntimeError)
    for name in ("initialize", "GatheredParameters"):
        assert callable(getattr(zero, name)), name
    assert callable(zero.utils.get_fp32_state_dict_from_zero_checkpoint)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_fp32_every_stage_matches_adamw_on_the_global_batch(runs, model, world):
    run = runs.train(model, world)
    ref, ref_losses = harness.reference_run(model)
    assert_trained(ref, harness.initial_weights(model), "AdamW reference")
    for stage in cases.STAGES:
        what = f"{model}, {world} ranks, stage {stage} fp32 vs AdamW"
        master = run.master(stage, "fp32")
        assert_trained(master, harness.initial_weights(model), what)
        assert_close(master, ref, what)
        # Each rank's loss is its own micro-batch's mean; their mean is the global batch's.
        losses = torch.tensor([run.info(stage, "fp32", r)["losses"] for r in range(world)]).mean(0)
        assert_close({"loss": losses}, {"loss": torch.tensor(ref_losses)}, what + " (losses)")


@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_stages_0_to_3_are_bitwise_equal(runs, model, world, dtype):
    run = runs.train(model, world)
    stage0 = run.master(0, dtype)
    assert_trained(stage0, harness.initial_weights(model), f"{model}, {world} ranks, stage 0 {dtype}")
    losses0 = [run.info(0, dtype, r)["losses"] for r in range(world)]
    for stage in (1, 2, 3):
        what = f"{model}, {world} ranks, {dtype}: stage {stage} vs stage 0"
        assert_bitwise(run.master(stage, dtype), stage0, what)
        assert [run.info(stage, dtype, r)["losses"] for r in range(world)] == losses0, what + " (losses)"


@pytest.mark.parametrize("world", (1, 3))
@pytest.mark.parametrize("model", MODELS)
def test_module_parameters_are_the_master_weights_in_the_config_dtype(runs, model, world):
    run = runs.train(model, world)
    for dtype in cases.DTYPES:
        for stage in cases.STAGES:
            what = f"{model}, {world} ranks, stage {stage} {dtype}: engine.module"
            assert run.info(stage, dtype)["param_dtypes"] == [str(DTYPE[dtype])], what
            # Rounded to nearest even from the fp32 master, tied names included (GatheredParameters
            # gives stage 3 its whole parameters).
            expected = {k: v.to(DTYPE[dtype]) for k, v in run.master(stage, dtype).items()}
            assert_bitwise(run.module(stage, dtype), expected, what)


@pytest.mark.parametrize("world", (2, 3))
@pytest.mark.parametrize("model", MODELS)
def test_stages_1_to_3_share_one_model_copy_over_processes(runs, model, world):
    """Over processes, stages 1-3 keep one model copy for every rank where it lies in rank 0's
    shared host arena (EngineImpl's shared model): the transformer's does. Each step writes the
    rank's slices there, and nothing is pushed or all-gathered (at stage 3 every unit is then
    persistent: nothing is gathered per use either). The mlp's copy is smaller than
    the arena's blocks (64 KiB, SharedHostArena::kMinBytes), private to each process, and
    all-gathered as before. At stage 0 in fp32 the transformer's step is shared out instead:
    each rank steps its own partition and pushes it into its peers' copies, which lie in their
    arenas (the mlp's do not: every rank steps everything). The module tests above check what
    every rank's copy then holds, and the stages stay bitwise equal either way. (At stage 3 the
    mlp's runs keep only units of at most 100 elements gathered, all in one block under 64 KiB:
    nothing pushed; see below.)"""
    run = runs.train(model, world)
    for dtype in cases.DTYPES:
        for stage in (0, 1, 2, 3):
            for rank in range(world):
                info = run.info(stage, dtype, rank)
                shared, pushed = info["shared_model_bytes"], info["pushed_bytes"]
                what = (f"{model}, {world} ranks, stage {stage} {dtype}, rank {rank}: "
                        f"{shared} bytes written into a shared copy, {pushed} pushed")
                assert (shared > 0) == (model == "transformer" and stage in (1, 2, 3)), what
                if model == "transformer" and stage == 3:
                    assert info["gathers"] == 0, what
                assert (pushed > 0) == (model == "transformer" and stage == 0
                                        and dtype == "fp32"), what


def launch_transformer_pairs(tmp_path, world, runs, args, variants):
    """{name: OUT}: one worker_train.py launch of the transformer's `runs` per variant (name: extra
    environment), each into tmp_path/name, checked to exit 0."""
    out = {}
    for name, env in variants.items():
        out[name] = tmp_path / name
        out[name].mkdir()
        launch = harness.torchrun(world, "worker_train.py",
                                  ["--model", "transformer", "--out", out[name], "--runs", runs, *args],
                                  600, out[name] / "log.txt", env=env)
        assert launch.returncode == 0, f"{name}: exit {launch.returncode}\n{launch.tail()}"
    return out


def test_stage_3_writes_its_slices_of_persistent_units_into_every_ranks_copy(tmp_path):
    """Stage 3 keeps units under stage3_param_persistence_threshold gathered, in one block. Where
    that block lies in the shared host arena (64 KiB and more: at the default threshold the
    whole transformer is persistent), each optimizer step writes the rank's new slices into
    every rank's copies instead of re-gathering the units. The forward reads those copies, so the
    losses, the modules' parameters and the masters are bitwise those of stage 0 and of stage 3
    with the push off (ZERO_MODEL_PUSH=0); both with a copy per rank (ZERO_SHARED_MODEL=0, not one
    copy the ranks share, see below). Stage 0 in fp32 shares its step out with the same push
    (each rank steps its own partition and writes it into the peer's copy): the same bits as every
    rank stepping everything, which it does with the push off."""
    world = 2
    out = launch_transformer_pairs(tmp_path, world, "0:fp32,3:fp32,3:bf16", ["--persistence", 100000],
                                   {"push": {"ZERO_SHARED_MODEL": "0"},
                                    "gather": {"ZERO_MODEL_PUSH": "0", "ZERO_SHARED_MODEL": "0"}})
    info = {(name, s, d, r): harness.read_json(out[name] / f"{s}-{d}.rank{r}.json")
            for name in out for s, d in (("0", "fp32"), ("3", "fp32"), ("3", "bf16"))
            for r in range(world)}
    for r in range(world):
        for d in ("fp32", "bf16"):
            assert info["push", "3", d, r]["pushed_bytes"] > 0, f"stage 3 {d}, rank {r}: nothing pushed"
            assert info["gather", "3", d, r]["pushed_bytes"] == 0, f"stage 3 {d}, rank {r}: pushed with it off"
            assert info["push", "3", d, r]["losses"] == info["gather", "3", d, r]["losses"], (d, r)
        assert info["push", "3", "fp32", r]["losses"] == info["push", "0", "fp32", r]["losses"], r
        assert info["push", "0", "fp32", r]["pushed_bytes"] > 0, f"stage 0, rank {r}: not shared out"
        assert info["gather", "0", "fp32", r]["pushed_bytes"] == 0, f"stage 0, rank {r}: pushed with it off"
        assert info["push", "0", "fp32", r]["losses"] == info["gather", "0", "fp32", r]["losses"], r
    for s, d in (("3", "fp32"), ("3", "bf16"), ("0", "fp32")):
        for kind in ("master", "module"):
            pushed = harness.load_st(out["push"] / f"{s}-{d}.{kind}.safetensors")
            assert_bitwise(pushed, harness.load_st(out["gather"] / f"{s}-{d}.{kind}.safetensors"),
                           f"stage {s} {d} {kind}: pushed vs gathered")
    stage0 = harness.load_st(out["push"] / "0-fp32.master.safetensors")
    assert_trained(stage0, harness.initial_weights("transformer"), "stage 0 fp32")
    assert_bitwise(harness.load_st(out["push"] / "3-fp32.master.safetensors"), stage0,
                   "stage 3 fp32 with pushed persistent units vs stage 0")


def test_a_shared_model_copy_trains_and_resumes_with_the_bits_of_private_ones(tmp_path):
    """Stages 1-3 with one model copy for both processes (the default) against a private copy
    per process (ZERO_SHARED_MODEL=0: at stages 1/2 the step pushes its new slices into the
    peers', at stage 3 units are gathered per use): the same losses, modules and masters, bit for
    bit, in fp32 and bf16, and both stage 0's. A checkpoint saved mid-run at stage 1 and resumed
    at stages 2 and 3 (written into the shared copy only after the ranks agree on the load) ends
    with the uninterrupted run's bits."""
    world, mid = 2, 10
    variants = {"shared": None, "private": {"ZERO_SHARED_MODEL": "0"}}
    out = launch_transformer_pairs(tmp_path, world,
                                   "0:fp32,1:fp32,2:fp32,3:fp32,1:bf16,2:bf16,3:bf16",
                                   ["--save-mid", f"1:fp32@{mid}"], variants)
    for name, env in variants.items():
        mid_dir = out[name] / "ckpt" / "1-fp32-mid"
        launch = harness.torchrun(world, "worker_train.py",
                                  ["--model", "transformer", "--out", out[name], "--runs", "",
                                   "--resume", f"2:fp32@{mid_dir},3:fp32@{mid_dir}"],
                                  600, out[name] / "resume-log.txt", env=env)
        assert launch.returncode == 0, f"{name} resume: exit {launch.returncode}\n{launch.tail()}"
    runs = [("1", "fp32"), ("2", "fp32"), ("3", "fp32"), ("1", "bf16"), ("2", "bf16"),
            ("3", "bf16")]
    for s, d in runs:
        for r in range(world):
            shared = harness.read_json(out["shared"] / f"{s}-{d}.rank{r}.json")
            private = harness.read_json(out["private"] / f"{s}-{d}.rank{r}.json")
            what = f"stage {s} {d}, rank {r}"
            assert shared["shared_model_bytes"] > 0 and shared["pushed_bytes"] == 0, what
            assert private["shared_model_bytes"] == 0, what
            if s == "3":
                assert shared["gathers"] == 0 and private["gathers"] > 0, what
            else:
                assert private["pushed_bytes"] > 0, what
            assert shared["losses"] == private["losses"], what
        for kind in ("master", "module"):
            assert_bitwise(harness.load_st(out["shared"] / f"{s}-{d}.{kind}.safetensors"),
                           harness.load_st(out["private"] / f"{s}-{d}.{kind}.safetensors"),
                           f"stage {s} {d} {kind}: shared vs private copies")
    stage0 = harness.load_st(out["shared"] / "0-fp32.master.safetensors")
    assert_trained(stage0, harness.initial_weights("transformer"), "stage 0 fp32")
    for s in ("1", "2", "3"):
        assert_bitwise(harness.load_st(out["shared"] / f"{s}-fp32.master.safetensors"), stage0,
                       f"stage {s} fp32 with a shared copy vs stage 0")
    for name in out:
        for s in ("2", "3"):
            resumed = harness.load_st(out[name] / f"resume-{s}-fp32.master.safetensors")
            assert_bitwise(resumed, harness.load_st(out[name] / f"{s}-fp32.master.safetensors"),
                           f"{name}: resumed at stage {s} from stage 1's step {mid} vs uninterrupted")
            info = harness.read_json(out[name] / f"resume-{s}-fp32.rank0.json")
            assert info["steps_after_load"] == mid, (name, s)
            assert (info["shared_model_bytes"] > 0) == (name == "shared"), (name, s)


@pytest.mark.parametrize("clip,gas,bucket", ((0.0, 1, None), (None, 1, None), (None, 2, None),
                                             (0.0, 1, 10**7)))
def test_the_step_sums_the_lone_units_left_to_it_with_the_collectives_bits(tmp_path, clip, gas, bucket):
    """The transformer's lone units whose reductions have not started when a window's last
    backward ends are left unreduced, and each optimizer step sums the ranks' gradients of them
    itself (clip 0: nothing reads the norm before the step), or the norm's pass does (None:
    cases' clipping), adding them to the window's earlier micro-steps (gas 2), reading the peers'
    staging buffers in the shared host arena (EngineImpl::FusedReduction; their gradients are then
    copied there, not lent). Without overlap_comm (stages 0-2 by default) a reduction starts once
    the units after it fill the whole reduce_bucket_size budget (cases' 5000: all but the last
    lone unit of each backward); with it (stage 3), once they fill a bucket, so cases' 5000 leaves
    stage 3 none and 10**7 leaves every stage all of them. The losses and masters are bitwise
    those of the collectives (ZERO_FUSED_REDUCTION=0), at every stage."""
    world = 2
    out = launch_transformer_pairs(tmp_path, world, "0:fp32,1:fp32,2:fp32,3:fp32",
                                   ["--gas", gas] + ([] if clip is None else ["--clip", clip])
                                   + ([] if bucket is None else ["--reduce-bucket", bucket]),
                                   {"fused": None, "collective": {"ZERO_FUSED_REDUCTION": "0"}})
    info = {(name, s, r): harness.read_json(out[name] / f"{s}-fp32.rank{r}.json")
            for name in out for s in "0123" for r in range(world)}
    lone = {r: info["collective", "0", r]["units_alone"] for r in range(world)}
    for s in "0123":
        for r in range(world):
            fused = info["fused", s, r]["units_fused"]
            if bucket is not None:
                assert fused == lone[r] > 0, f"stage {s}, rank {r}: {fused} of {lone[r]} units fused"
            else:
                assert (fused > 0) == (s != "3"), f"stage {s}, rank {r}: {fused} units fused"
            assert info["collective", s, r]["units_fused"] == 0, f"stage {s}, rank {r}"
            assert info["fused", s, r]["losses"] == info["collective", "0", r]["losses"], (s, r)
            assert info["collective", s, r]["losses"] == info["collective", "0", r]["losses"], (s, r)
    reference = harness.load_st(out["collective"] / "0-fp32.master.safetensors")
    assert_trained(reference, harness.initial_weights("transformer"), "stage 0 fp32, collectives")
    for name in out:
        for s in "0123":
            for kind in ("master", "module"):
                what = f"stage {s} fp32 {kind}, {name} vs stage 0 with collectives"
                expected = harness.load_st(out["collective"] / f"0-fp32.{kind}.safetensors")
                assert_bitwise(harness.load_st(out[name] / f"{s}-fp32.{kind}.safetensors"), expected, what)


@pytest.mark.parametrize("gas", (1, 2))
def test_the_step_taken_during_backward_has_the_bits_of_the_step_after_it(tmp_path, gas):
    """Without clipping and with every lone unit held to the end of backward (reduce_bucket_size
    10**7), each window's last micro-step steps the transformer's lone units during backward as
    both processes' gradients of a unit complete, from the second optimizer step on (the first
    exchanges the boards): the losses, modules and masters are bitwise those of the step after
    backward (ZERO_STEP_IN_BACKWARD=0) and of stage 0, at every stage, with and without
    accumulation."""
    world = 2
    out = launch_transformer_pairs(tmp_path, world, "0:fp32,1:fp32,2:fp32,3:fp32",
                                   ["--clip", 0, "--reduce-bucket", 10**7, "--gas", gas],
                                   {"during": None, "after": {"ZERO_STEP_IN_BACKWARD": "0"}})
    for s in "0123":
        for r in range(world):
            during = harness.read_json(out["during"] / f"{s}-fp32.rank{r}.json")
            after = harness.read_json(out["after"] / f"{s}-fp32.rank{r}.json")
            what = f"stage {s}, rank {r}"
            # Every lone unit of every window but the first: as many as the fused ones, less one
            # window's.
            windows = cases.STEPS // gas
            assert during["units_stepped_in_backward"] == during["units_fused"] * (windows - 1) // windows > 0, what
            assert after["units_stepped_in_backward"] == 0, what
            assert during["losses"] == after["losses"], what
    reference = harness.load_st(out["after"] / "0-fp32.master.safetensors")
    assert_trained(reference, harness.initial_weights("transformer"), "stage 0 fp32, after backward")
    for s in "0123":
        for kind in ("master", "module"):
            expected = harness.load_st(out["after"] / f"0-fp32.{kind}.safetensors")
            for name in out:
                assert_bitwise(harness.load_st(out[name] / f"{s}-fp32.{kind}.safetensors"), expected,
                               f"stage {s} fp32 {kind}, {name} vs stage 0 after backward")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("model", MODELS)
def test_mixed_precision_trains_like_fp32(runs, model, world):
    run = runs.train(model, world)
    fp32 = torch.tensor(run.info(0, "fp32")["losses"])
    for dtype in ("bf16", "fp16"):
        losses = torch.tensor(run.info(0, dtype)["losses"])
        assert torch.isfinite(losses).all(), f"{model}, {world} ranks, {dtype}: losses {losses.tolist()}"
        # Loose: the same trajectory up to 16-bit rounding (a loss scale left in the gradients,
        # or an update skipped for good, would be far off).
        assert torch.allclose(losses, fp32, rtol=0.05, atol=0.02), \
            f"{model}, {world} ranks, {dtype} losses {losses.tolist()} vs fp32 {fp32.tolist()}"


@pytest.mark.parametrize("world", WORLDS)
def test_engine_reports_batch_sizes_steps_and_lr(runs, world):
    run = runs.train("mlp", world)
    for dtype in cases.DTYPES:
        for stage in cases.STAGES:
            for rank in range(world):
                info = run.info(stage, dtype, rank)
                what = f"mlp, {world} ranks, stage {stage} {dtype}, rank {rank}"
                assert info["train_batch_size"] == cases.GLOBAL_BATCH, what
                assert info["micro_batch"] == cases.GLOBAL_BATCH // world, what
                assert info["accumulation"] == 1, what
                assert info["global_steps"] == cases.STEPS, what
                assert info["boundaries"] == [True] * cases.STEPS, what
                assert info["lr"] == pytest.approx([cases.LR]), what


def test_plain_python_is_one_rank(runs, tmp_path):
    """`python script.py` without a launcher trains as one rank: the same weights as torchrun -n 1."""
    launched = runs.train("mlp", 1)
    result = harness.one_process("worker_train.py", ["--model", "mlp", "--out", tmp_path,
                                                     "--runs", "3:fp32"], timeout=120)
    assert result.returncode == 0 and not result.timed_out, repr(result)
    assert_bitwise(harness.load_st(tmp_path / "3-fp32.master.safetensors"), launched.master(3, "fp32"),
                   "mlp stage 3 fp32: plain python vs torchrun --nproc-per-node 1")
