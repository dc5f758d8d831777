"""Bad input gives a zero.ZeroError naming the bad value, on every rank, and never a hang.

Multi-rank cases start their ranks with harness.spawn_ranks rather than torchrun: torchrun stops
the other workers as soon as one fails, which would hide whether each rank reports the problem.
"""
import re

import pytest

import harness

NPROC = 2
TIMEOUT_S = 90  # a hang fails the test; a working check answers in seconds
PEER_DEATH_NOTICE_S = 30

# case -> patterns that every rank's message must match (case-insensitive)
MULTI_RANK = {
    "params-differ": [r"0\.weight"],
    "param-replaced": [r"0\.weight"],
    "loss-without-graph": [r"grad"],
    "auto-in-config": [r"optimizer\.params\.lr", r"auto"],
}


def results(workdir, nproc):
    return {r: (harness.read_json(workdir / f"result.rank{r}.json")
                if (workdir / f"result.rank{r}.json").exists() else None) for r in range(nproc)}


def assert_zero_error(rank_result, result, patterns, what):
    where = f"{what}, rank {rank_result.rank}"
    assert not rank_result.timed_out, f"{where}: still running after {TIMEOUT_S} s (hang)\n{rank_result!r}"
    assert result is not None, f"{where}: wrote no result\n{rank_result!r}"
    assert result["outcome"] == "error", f"{where}: finished without an error"
    assert result["is_zero_error"], f"{where}: raised {result['type']}, not zero.ZeroError: {result['message']}"
    assert rank_result.returncode != 0, f"{where}: exit code 0 after an error"
    for p in patterns:
        assert re.search(p, result["message"], re.I), f"{where}: message does not name /{p}/: {result['message']!r}"


@pytest.mark.parametrize("case", sorted(MULTI_RANK))
def test_bad_input_is_a_clear_error_on_every_rank(tmp_path, case):
    ranks = harness.spawn_ranks(NPROC, "worker_bad.py", [case, tmp_path], TIMEOUT_S, tmp_path)
    found = results(tmp_path, NPROC)
    for r in ranks:
        assert_zero_error(r, found[r.rank], MULTI_RANK[case], case)


def test_a_rank_that_exits_early_is_named_by_the_others(tmp_path):
    ranks = harness.spawn_ranks(NPROC, "worker_bad.py", ["rank-exits", tmp_path], TIMEOUT_S, tmp_path)
    found = results(tmp_path, NPROC)
    assert found[1] and found[1]["outcome"] == "exited" and ranks[1].returncode == 3, repr(ranks[1])
    assert_zero_error(ranks[0], found[0], [r"rank\W*1\b"], "rank 1 exited before step 2")
    waited = found[0]["time"] - found[1]["time"]
    assert waited < PEER_DEATH_NOTICE_S, f"rank 0 noticed rank 1's exit after {waited:.1f} s"


# case -> (environment, patterns)
ONE_PROCESS = {
    "config-missing": ({}, [r"no-such-dir/ds_config\.json"]),
    "no-parameters": ({}, [r"parameter"]),
    "int64-parameter": ({}, [r"\bcount\b", r"int64|long"]),
    "half-launcher-env": ({"RANK": "1"}, [r"WORLD_SIZE"]),
}


@pytest.mark.parametrize("case", sorted(ONE_PROCESS))
def test_bad_input_in_one_process_is_a_zero_error_naming_the_value(tmp_path, case):
    env, patterns = ONE_PROCESS[case]
    result = harness.one_process("worker_bad.py", [case, tmp_path], TIMEOUT_S, env=env)
    assert_zero_error(result, results(tmp_path, 1 if "RANK" not in env else int(env["RANK"]) + 1)
                      [int(env.get("RANK", 0))], patterns, case)
