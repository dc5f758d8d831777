"""`python -m zero.as_deepspeed`: a DeepSpeed script runs on zero unchanged, in one process and
under torchrun (issue 32, its first part: the module and the names accelerate and transformers
import; the Trainer and Accelerate flows are not covered yet)."""
import json
import subprocess
import sys

from packaging.version import Version

import harness

HERE = harness.HERE


def run_module(args, timeout=120):
    return subprocess.run([sys.executable, "-m", "zero.as_deepspeed", *map(str, args)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=harness.child_env(), cwd=HERE, timeout=timeout)


def check_seen(seen, world):
    assert seen["module"] == "zero._deepspeed" and seen["name"] == "__main__"
    assert seen["find_spec"] and seen["metadata_name"] == "deepspeed"
    version = Version(seen["metadata_version"])
    # accelerate's and transformers' gates go up to 0.16; zero follows DeepSpeed 0.19.
    assert version >= Version("0.16.0") and seen["metadata_version"] == seen["version"]
    assert "+zero" in seen["version"]
    assert "WarmupLR" in seen["schedules"] and seen["env_file"] == ".deepspeed_env"
    assert seen["device"] == "cpu" and seen["engine_class"] == "ZeroEngine" and seen["is_engine"]
    assert seen["dist"][:2] == [True, "gloo"] and seen["dist"][3] == world
    assert seen["clone"] == [8, [0.0, 1.0, 2.0, 3.0]]  # the slice's own 2 floats, not 4
    assert seen["steps"] == 3 and seen["moved"] > 1e-4


def test_a_script_imports_deepspeed_and_trains_on_zero(tmp_path):
    proc = run_module([HERE / "worker_as_deepspeed.py", tmp_path, "--extra", "1"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen["argv"] == [str(tmp_path), "--extra", "1"]
    check_seen(seen, 1)
    banners = [l for l in proc.stdout.splitlines() if "serving DeepSpeed's API" in l]
    assert len(banners) == 1, proc.stdout[-2000:]


def test_under_torchrun_every_rank_gets_deepspeed_and_rank_0_announces_it(tmp_path):
    launch = harness.torchrun(2, "zero.as_deepspeed", [HERE / "worker_as_deepspeed.py", tmp_path],
                              240, tmp_path / "log.txt", module=True)
    assert launch.returncode == 0, launch.tail()
    for rank in (0, 1):
        check_seen(json.loads((tmp_path / f"rank{rank}.json").read_text()), 2)
    assert launch.output.count("serving DeepSpeed's API") == 1, launch.tail()


def test_install_from_python_and_bad_usage(tmp_path):
    code = ("import zero.as_deepspeed, importlib.metadata; d = zero.as_deepspeed.install(); "
            "zero.as_deepspeed.install(); import deepspeed, deepspeed.comm; "
            "assert deepspeed is d and deepspeed.comm.get_world_size() == 1; "
            "print(importlib.metadata.version('deepspeed'))")
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=harness.child_env(), cwd=HERE,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("serving DeepSpeed's API") == 1
    assert "+zero" in proc.stdout.splitlines()[-1]
    none = run_module([])
    assert none.returncode == 2 and "usage: python -m zero.as_deepspeed" in none.stdout
    missing = run_module([tmp_path / "nope.py"])
    assert missing.returncode == 2 and "nope.py' is not a file" in missing.stdout


EXIT_SCRIPT = """
import torch
import torch.distributed as dist
import deepspeed

deepspeed.init_distributed()
out = [torch.empty(1) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.tensor([float(dist.get_rank())]))
assert dist.get_backend() == "gloo" and [t.item() for t in out] == list(range(len(out)))
# No destroy_process_group(), as in the Hugging Face Trainer's scripts.
"""


def test_a_script_that_leaves_its_gloo_group_alive_exits_cleanly(tmp_path):
    """A gloo default group alive at interpreter exit aborted about half of such 4-rank launches
    ("terminate called without an active exception", pytorch issue 190489); init_distributed
    destroys it at exit. Five launches: the old behaviour passes all five about once in 32."""
    script = tmp_path / "leave_group.py"
    script.write_text(EXIT_SCRIPT)
    for i in range(5):
        launch = harness.torchrun(4, "zero.as_deepspeed", [script], 240, tmp_path / f"log{i}.txt",
                                  module=True)
        assert launch.returncode == 0, f"launch {i}:\n{launch.tail()}"
        assert "terminate called" not in launch.output, f"launch {i}:\n{launch.tail()}"
