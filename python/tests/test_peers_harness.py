"""The peers harnesses' arithmetic (benchmarks/peers/torch_peers.py, its report and common.py):
the paired figures at job level, the best peer by paired share, the refusal of a ratio whose
baseline is not positive (torch_peers and cuda_train_peers share it), and the alternating order."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))
import common  # noqa: E402
import torch_peers  # noqa: E402
import torch_peers_report  # noqa: E402


def rank(steps, bare):
    """A rank's per-step records: (step, forward, backward, outside, CPU) seconds."""
    return {"steps": [list(s) for s in steps], "bare_steps": [list(b) for b in bare]}


def test_paired_figures_take_the_slowest_rank_of_each_step():
    # Rank 1 is slow at step 0 and rank 0 at step 1: per step the job waits for the slower one.
    r0 = rank([(0.110, 0.03, 0.06, 0.020, 0.10), (0.130, 0.04, 0.07, 0.020, 0.12),
               (0.115, 0.03, 0.06, 0.025, 0.11)],
              [(0.100, 0.04, 0.06, 0.000, 0.10), (0.120, 0.05, 0.07, 0.000, 0.12),
               (0.100, 0.04, 0.06, 0.000, 0.10)])
    r1 = rank([(0.140, 0.04, 0.08, 0.020, 0.13), (0.125, 0.03, 0.07, 0.025, 0.12),
               (0.116, 0.03, 0.06, 0.026, 0.11)],
              [(0.120, 0.05, 0.07, 0.000, 0.12), (0.100, 0.04, 0.06, 0.000, 0.10),
               (0.101, 0.04, 0.06, 0.000, 0.10)])
    got = torch_peers.paired_figures([r0, r1])
    # Job steps 140, 130, 116 ms against job bare steps 120, 120, 101: differences 20, 10, 15.
    assert got["ms_engine_paired"] == pytest.approx(15.0)
    # Job steps less the slowest rank's forward + backward (120, 110, 90 ms): 20, 20, 26.
    assert got["ms_outside_job"] == pytest.approx(20.0)
    # Backward: job 80, 70, 60 against bare 70, 70, 60 ms.
    assert got["backward_over_paired_bare"] == pytest.approx(1.0)
    assert got["ms_paired_bare_step"] == pytest.approx(120.0)
    assert got["cpu_ms_engine_paired"] == pytest.approx(10.0)


def test_the_outside_phases_are_those_of_the_rank_last_out_of_backward():
    # Step 0: rank 1 leaves backward last (120 ms against 90); step 1: rank 0 (110 against 100).
    r0 = rank([(0.140, 0.03, 0.06, 0.050, 0.1), (0.130, 0.04, 0.07, 0.020, 0.1)], [])
    r1 = rank([(0.135, 0.04, 0.08, 0.015, 0.1), (0.128, 0.03, 0.07, 0.028, 0.1)], [])
    # reduce_wait, optimizer, norm, all_gather seconds per step. Rank 0's 30 ms wait at step 0 is
    # its wait for rank 1: not counted, since rank 1 is the one the job waits for there.
    r0["phase_steps"] = [[0.030, 0.004, 0.001, 0.002], [0.006, 0.005, 0.001, 0.003]]
    r1["phase_steps"] = [[0.008, 0.004, 0.001, 0.002], [0.020, 0.004, 0.000, 0.002]]
    got = torch_peers.outside_phases([r0, r1])
    # The job's outside: 140 - 120 = 20 ms, then 130 - 110 = 20 ms.
    assert got["reduce_wait_ms"] == pytest.approx((8 + 6) / 2)
    assert got["optimizer_ms"] == pytest.approx(4.5)
    assert got["all_gather_ms"] == pytest.approx(2.5)
    # What the phases leave: 20 - 15 = 5 ms at step 0, 20 - 15 = 5 ms at step 1.
    assert got["rest_ms"] == pytest.approx(5.0)


def row(peer, step, paired):
    return {"peer": peer, "ms_step": step, "ms_engine_paired": paired}


def test_the_best_peer_is_the_one_with_the_smallest_paired_share():
    rows = [row("zero-s0", 150.0, 10.0), row("ddp", 140.0, 40.0), row("deepspeed-s0", 160.0, 25.0)]
    got = torch_peers_report.engine_ratios(rows)[0]
    assert got["paired"] and got["best_peer"] == "deepspeed-s0"
    assert got["ratio"] == pytest.approx(0.4)
    assert got["step_ratio"] == pytest.approx(150.0 / 160.0)


@pytest.mark.parametrize("theirs, mine, why", [(0.0, 5.0, "not positive"), (-3.0, 5.0, "not positive"),
                                               (20.0, -1.0, "negative")])
def test_a_ratio_that_would_read_as_a_win_is_refused(theirs, mine, why):
    got = torch_peers_report.engine_ratios([row("zero-s1", 150.0, mine), row("ddp", 140.0, theirs)])[1]
    assert got["ratio"] is None
    assert why in got["ratio_refused"]
    assert "no ratio" in torch_peers_report.ratio_lines({1: got})[0]


@pytest.mark.parametrize("num, den, why", [(5.0, None, "no engine share for torch"),
                                           (None, 5.0, "no engine share for zero"),
                                           (5.0, 0.0, "torch's engine share is 0.0 ms, not positive"),
                                           (-2.0, 5.0, "zero's engine share is -2.0 ms, negative")])
def test_the_ratio_guard_names_whose_figure_is_wrong(num, den, why):
    got, refused = common.ratio_or_refusal(num, den, "zero", "torch", "engine share", " (noisy)")
    assert got is None and why in refused
    assert common.ratio_or_refusal(3.0, 4.0, "zero", "torch", "engine share") == (0.75, None)


def test_alternate_reverses_every_other_repeat():
    seen = []
    common.alternate("t", 3, ["a", "b", "c"], lambda label, i: seen.append(label) or {"ms_step": 1.0})
    assert seen == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert [common.round_order(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_the_workers_import_this_repositorys_zero(tmp_path, monkeypatch):
    """torch_peers measures the working tree: the repository's python/ with a build's library, not
    whatever package a venv was given earlier; and says so."""
    lib = tmp_path / "libzero.so.0"
    lib.write_bytes(b"")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env, what = common.zero_package_env(str(lib))
    assert env["PYTHONPATH"].split(":") == [str(common.REPO / "python"), "/elsewhere"]
    assert env["ZERO_LIBRARY"] == str(lib.resolve())
    assert "this repository's python/" in what and str(lib) in what
    with pytest.raises(SystemExit, match="no such file"):
        common.zero_package_env(str(tmp_path / "missing.so"))
    monkeypatch.setattr(common, "REPO", tmp_path)  # a checkout without a build
    env, what = common.zero_package_env()
    assert env == {} and "installed zero package" in what


def test_the_configs_carry_overlap_comm_and_the_bf16_overflow_check_only_when_asked():
    # Left out by default, so each engine applies DeepSpeed's own defaults.
    plain = torch_peers.zero_config(3, 4, "bf16")
    assert "overlap_comm" not in plain["zero_optimization"]
    assert plain["bf16"] == {"enabled": True}
    asked = torch_peers.zero_config(3, 4, "bf16", overlap_comm=False, check_grad_overflow=False)
    assert asked["zero_optimization"]["overlap_comm"] is False
    assert asked["bf16"] == {"enabled": True, "check_grad_overflow": False}
    # fp32 has no bf16 block to carry the check.
    assert "bf16" not in torch_peers.zero_config(1, 4, "fp32", check_grad_overflow=True)


def test_every_unit_persistent_at_stage_3_only_when_asked():
    # Both thresholds above any model's size at stage 3; left out otherwise, and at stages 0-2.
    assert not any("persistence" in k for k in torch_peers.zero_config(3, 4)["zero_optimization"])
    zo = torch_peers.zero_config(3, 4, persist_all=True)["zero_optimization"]
    assert zo["stage3_param_persistence_threshold"] == zo["stage3_model_persistence_threshold"]
    assert zo["stage3_param_persistence_threshold"] > 10**12
    assert torch_peers.zero_config(2, 4, persist_all=True)["zero_optimization"] == {"stage": 2}


def test_stage_0_sharing_its_step_out_is_held_to_the_limit_of_its_share():
    """A stage-0 run that pushed (each rank stepped a 1/N share) is measured against the probe of
    that share, one that did not against the whole model's."""
    whole = {"partition_params": 4_000_000, "bytes_per_param": 28, "probe_gb_per_s": 50.0,
             "limit_ms": 2.24, "cold_probe_gb_per_s": 40.0, "cold_limit_ms": 2.8}
    share = dict(whole, partition_params=2_000_000, limit_ms=1.12, cold_limit_ms=1.4)
    limits = {0: dict(whole, shared_step=share), 1: share}
    rows = [{"peer": "zero-s0", "ms_outside_job": 0.56, "profile": {"pushed_bytes": 8e6}},
            {"peer": "zero-s0", "ms_outside_job": 0.56, "profile": {"pushed_bytes": 0.0}},
            {"peer": "zero-s1", "ms_outside_job": 0.56, "profile": {"pushed_bytes": 0.0}}]
    shared, alone, stage1 = torch_peers_report.limit_lines(rows, limits)
    assert "0.50x the optimizer's traffic limit (2.00M params" in shared
    assert shared.endswith("the step shared out (each rank steps a 1/N share)")
    assert "0.25x the optimizer's traffic limit (4.00M params" in alone
    assert "shared out" not in alone
    assert "0.50x the optimizer's traffic limit (2.00M params" in stage1 and "shared out" not in stage1
