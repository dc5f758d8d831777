"""zero.Init (deepspeed.zero.Init): a model built inside it is partitioned as DeepSpeed partitions
it, shows the same values through GatheredParameters, lets Module.apply and modifier_rank change
it as DeepSpeed does, and trains through zero.initialize bitwise as the same model built outside
(worker_zero_init.py; one process and two under torchrun)."""
import json

import pytest

import harness


def check(report, world):
    assert report["partitioned"] and report["tied_kept"] and report["released"]
    assert report["gathered_eq"], "GatheredParameters does not show the values built outside"
    assert report["apply_eq"], "Module.apply inside zero.Init lost rank 0's values"
    assert report["modifier"] == [True, True]
    assert "mpu" in report["refused"][0]
    assert f"modifier_rank={world}" in report["refused"][1]
    assert report["trained_eq"] == {"1": True, "3": True}


def test_zero_init_in_one_process(tmp_path):
    result = harness.one_process("worker_zero_init.py", [tmp_path], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    check(json.loads((tmp_path / "rank0.json").read_text()), 1)


def test_zero_init_on_two_ranks(tmp_path):
    launch = harness.torchrun(2, "worker_zero_init.py", [tmp_path], 300, tmp_path / "log.txt")
    assert launch.returncode == 0, launch.tail()
    for rank in (0, 1):
        check(json.loads((tmp_path / f"rank{rank}.json").read_text()), 2)
