"""Hugging Face Trainer and Accelerate scripts run on zero unchanged (`python -m zero.as_deepspeed`,
issue 32), and side by side with real DeepSpeed on the CPU.

The scripts are worker_hf_trainer.py (Trainer with --deepspeed, a tiny random GPT-2) and
worker_accelerate.py (a plain Accelerate loop with a DeepSpeed plugin). Each run is cached per
test session: several tests read the same run.

What is checked:
- the Trainer at stages 1-3 with the config's optimizer and scheduler, the config's optimizer and
  the Trainer's schedule, and neither (the Trainer's own AdamW and schedule): train, evaluate,
  save_model loadable by from_pretrained, checkpoints, and resume_from_checkpoint continuing
  bitwise; the stages bitwise equal to each other (model built outside zero.Init);
- the same in 2 processes under torchrun;
- DeepSpeed 0.19 on the same scripts: every logged loss and the final weights within 1e-5, and
  under zero.Init (stage 3, from_config) the initial weights DeepSpeed's;
- the Accelerate loop: resume bitwise, stages bitwise, DeepSpeed within 1e-5."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import harness

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

HERE = harness.HERE
TIMEOUT = 600
_runs = {}


def _deepspeed_available():
    try:
        import importlib.metadata
        return importlib.metadata.version("deepspeed").startswith("0.")
    except Exception:
        return False


needs_deepspeed = pytest.mark.skipif(not _deepspeed_available(),
                                     reason="DeepSpeed (a test dependency) is not installed")


def _launch(engine, nproc, script, out, args, log):
    """Runs `script out args` on `engine` ("zero" or "deepspeed") in nproc processes."""
    env = {"DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    target = [HERE / script, out, *args]
    if engine == "zero" and nproc == 1:
        # As a user types it: no launcher, one process.
        proc = subprocess.run([sys.executable, "-m", "zero.as_deepspeed", *map(str, target)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=harness.child_env(env), cwd=HERE, timeout=TIMEOUT)
        Path(log).write_text(proc.stdout)
        return proc.returncode, proc.stdout
    if engine == "zero":
        launch = harness.torchrun(nproc, "zero.as_deepspeed", target, TIMEOUT, log, env=env,
                                  module=True)
        return launch.returncode, launch.output
    if nproc == 1:  # DeepSpeed wants a launcher's environment: one rank of it
        results = harness.spawn_ranks(1, script, [out, *args], TIMEOUT, Path(out).parent, env=env)
        return results[0].returncode, results[0].stderr
    launch = harness.torchrun(nproc, script, [out, *args], TIMEOUT, log, env=env)
    return launch.returncode, launch.output


def run(tmp_path_factory, engine, script, nproc=1, resume=False, **opts):
    """The output folder of a (cached) run; fails the test with the log's tail if it failed."""
    args = []
    for k, v in sorted(opts.items()):
        args += [f"--{k.replace('_', '-')}", str(v)]
    key = (engine, script, nproc, tuple(args))
    if key not in _runs:
        out = tmp_path_factory.mktemp(f"{engine}-{Path(script).stem}-{nproc}")
        _runs[key] = out
    out = _runs[key]
    done = out / ("result-resumed.json" if resume else "result.json")
    if not done.exists():
        extra = []
        if resume and script == "worker_hf_trainer.py":
            extra = ["--resume", out / "trainer" / "checkpoint-3"]
        elif resume:
            extra = ["--resume"]
        out.mkdir(parents=True, exist_ok=True)
        code, output = _launch(engine, nproc, script, out, args + extra,
                               out.parent / f"{out.name}{'-resume' if resume else ''}.log")
        tail = harness.log_tail(output)
        assert code == 0, f"{engine} {script} {args}{' resume' if resume else ''}:\n{tail}"
        assert done.exists(), tail
    return out


def losses(result):
    return [e["loss"] for e in result["log_history"] if "loss" in e]


def load_final(path):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise(a, b, what):
    assert a.keys() == b.keys(), what
    moved = 0
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs by {(a[k] - b[k]).abs().max()}"
        moved += int(a[k].abs().sum() > 0)
    assert moved > 0, f"{what}: every tensor is zero"


def assert_close(a, b, what, tol=1e-5):
    assert a.keys() == b.keys(), what
    for k in a:
        diff = (a[k].float() - b[k].float()).abs().max().item()
        assert diff <= tol, f"{what}: {k} differs by {diff:.3g} (> {tol})"


def trainer_result(out, resumed=False):
    return json.loads((out / ("result-resumed.json" if resumed else "result.json")).read_text())


# --- the Trainer, one process ---

@pytest.mark.parametrize("variant", ["config", "mixed", "none"])
def test_trainer_stages_train_evaluate_save_and_agree_bitwise(tmp_path_factory, variant):
    finals, logged = {}, {}
    for stage in (1, 2, 3):
        out = run(tmp_path_factory, "zero", "worker_hf_trainer.py", stage=stage, variant=variant)
        r = trainer_result(out)
        assert r["engine"] == "ZeroEngine" and "+zero" in r["deepspeed"]
        assert r["global_step"] == 6
        logged[stage] = losses(r)
        assert len(logged[stage]) == 6 and all(math.isfinite(x) for x in logged[stage])
        assert logged[stage][-1] < logged[stage][0], logged[stage]
        assert math.isfinite(r["evaluation"]["eval_loss"])
        lrs = [e["learning_rate"] for e in r["log_history"] if "learning_rate" in e]
        assert len(set(lrs)) > 2, f"the schedule did not move the lr: {lrs}"
        assert (out / "trainer" / "checkpoint-3").is_dir()
        assert (out / "trainer" / "checkpoint-6" / "latest").is_file()
        finals[stage] = load_final(r["final"])
    assert logged[1] == logged[2] == logged[3]
    assert_bitwise(finals[1], finals[2], f"{variant}: stage 2 against stage 1")
    assert_bitwise(finals[1], finals[3], f"{variant}: stage 3 against stage 1")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trainer_resumes_from_a_checkpoint_bitwise(tmp_path_factory, stage):
    for variant in (("none", "config") if stage == 2 else ("none",)):
        out = run(tmp_path_factory, "zero", "worker_hf_trainer.py", stage=stage, variant=variant)
        run(tmp_path_factory, "zero", "worker_hf_trainer.py", resume=True, stage=stage,
            variant=variant)
        whole, resumed = trainer_result(out), trainer_result(out, resumed=True)
        assert resumed["global_step"] == 6
        # The resumed history starts with the checkpoint's (steps 1-3) and goes on from there.
        assert losses(resumed) == losses(whole), variant
        assert_bitwise(load_final(whole["final"]), load_final(resumed["final"]),
                       f"stage {stage} {variant}: resumed from checkpoint-3")


# --- the Trainer, two processes ---

def test_trainer_under_torchrun_stages_agree_bitwise_and_resume(tmp_path_factory):
    finals = {}
    for stage in (1, 2, 3):
        out = run(tmp_path_factory, "zero", "worker_hf_trainer.py", nproc=2, stage=stage)
        r = trainer_result(out)
        assert r["global_step"] == 6 and len(losses(r)) == 6
        finals[stage] = load_final(r["final"])
    assert_bitwise(finals[1], finals[2], "2 processes: stage 2 against stage 1")
    assert_bitwise(finals[1], finals[3], "2 processes: stage 3 against stage 1")
    out = run(tmp_path_factory, "zero", "worker_hf_trainer.py", nproc=2, resume=True, stage=3)
    assert_bitwise(finals[3], load_final(trainer_result(out, resumed=True)["final"]),
                   "2 processes, stage 3: resumed from checkpoint-3")


# --- side by side with DeepSpeed ---

@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_trainer_agrees_with_deepspeed(tmp_path_factory, stage):
    ours = trainer_result(run(tmp_path_factory, "zero", "worker_hf_trainer.py", stage=stage,
                              variant="none"))
    theirs = trainer_result(run(tmp_path_factory, "deepspeed", "worker_hf_trainer.py",
                                stage=stage, variant="none"))
    assert "+zero" not in theirs["deepspeed"] and theirs["engine"] == "DeepSpeedEngine"
    for a, b in zip(losses(ours), losses(theirs), strict=True):
        assert abs(a - b) <= 1e-5, (losses(ours), losses(theirs))
    assert_close(load_final(ours["final"]), load_final(theirs["final"]),
                 f"stage {stage}: zero against DeepSpeed")


@needs_deepspeed
def test_zero_init_builds_deepspeeds_initial_weights_and_trains_like_it(tmp_path_factory):
    outs = {e: run(tmp_path_factory, e, "worker_hf_trainer.py", stage=3, variant="none",
                   build="from_config") for e in ("zero", "deepspeed")}
    initial = {e: harness.load_st(o / "initial.safetensors") for e, o in outs.items()}
    assert_bitwise(initial["zero"], initial["deepspeed"], "initial weights under zero.Init")
    # ... and they are not what the model gets without zero.Init (README says so).
    direct = harness.load_st(run(tmp_path_factory, "zero", "worker_hf_trainer.py", stage=3,
                                 variant="none") / "initial.safetensors")
    assert any(not torch.equal(direct[k], initial["zero"][k]) for k in direct)
    ours, theirs = trainer_result(outs["zero"]), trainer_result(outs["deepspeed"])
    for a, b in zip(losses(ours), losses(theirs), strict=True):
        assert abs(a - b) <= 1e-5, (losses(ours), losses(theirs))
    assert_close(load_final(ours["final"]), load_final(theirs["final"]),
                 "zero.Init, stage 3: zero against DeepSpeed")


# --- Accelerate ---

def accelerate_result(out, resumed=False):
    suffix = "-resumed" if resumed else ""
    return (json.loads((out / f"result{suffix}.json").read_text()),
            harness.load_st(out / f"final{suffix}.safetensors"))


def test_accelerate_loop_resumes_bitwise_and_stages_agree(tmp_path_factory):
    finals = {}
    for stage in (1, 2, 3):
        out = run(tmp_path_factory, "zero", "worker_accelerate.py", stage=stage)
        run(tmp_path_factory, "zero", "worker_accelerate.py", resume=True, stage=stage)
        (r, final), (rr, resumed) = accelerate_result(out), accelerate_result(out, True)
        assert r["steps"] == 6 and len(r["norms"]) == 6 and all(n > 0 for n in r["norms"])
        assert r["losses"][-1] < r["losses"][0]
        assert rr["losses"] == r["losses"][6:] and rr["lrs"] == r["lrs"][3:]
        assert_bitwise(final, resumed, f"accelerate stage {stage}: load_state")
        finals[stage] = final
    assert_bitwise(finals[1], finals[2], "accelerate: stage 2 against stage 1")
    assert_bitwise(finals[1], finals[3], "accelerate: stage 3 against stage 1")


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_accelerate_loop_agrees_with_deepspeed(tmp_path_factory, stage):
    ours = accelerate_result(run(tmp_path_factory, "zero", "worker_accelerate.py", stage=stage))
    theirs = accelerate_result(run(tmp_path_factory, "deepspeed", "worker_accelerate.py",
                                   stage=stage))
    for key in ("losses", "norms", "lrs"):
        for a, b in zip(ours[0][key], theirs[0][key], strict=True):
            assert abs(a - b) <= 1e-5, (key, ours[0][key], theirs[0][key])
    assert_close(ours[1], theirs[1], f"accelerate stage {stage}: zero against DeepSpeed")


def test_accelerate_launch_runs_the_loop_on_zero(tmp_path_factory, tmp_path):
    """`accelerate launch -m zero.as_deepspeed script.py`: the same run as `python -m ...`."""
    plain = accelerate_result(run(tmp_path_factory, "zero", "worker_accelerate.py", stage=2))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu",
           "-m", "zero.as_deepspeed", str(HERE / "worker_accelerate.py"), str(tmp_path),
           "--stage", "2"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=harness.child_env(), cwd=HERE, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "serving DeepSpeed's API" in proc.stdout
    launched = accelerate_result(tmp_path)
    assert launched[0]["losses"] == plain[0]["losses"]
    assert_bitwise(launched[1], plain[1], "accelerate launch against python -m")
