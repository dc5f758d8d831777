"""Launching ranks for the tests, each launch under a timeout so that a hang fails the test.

torchrun() runs a script the way users do (sys.executable -m torch.distributed.run). It stops
every other worker as soon as one fails, so a test that must see what EACH rank reports on bad
input uses spawn_ranks() instead: the same environment torchrun gives its workers, one process
per rank, each left to finish (or time out) on its own.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import safetensors.torch
import torch

import cases

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # A rank that dies of a signal (SIGABRT, SIGSEGV) prints every thread's Python stack first.
    env["PYTHONFAULTHANDLER"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Launch:
    """A finished launch: exit code(s), output, and how long it took."""

    def __init__(self, returncode, output, seconds, timed_out):
        self.returncode, self.output, self.seconds, self.timed_out = returncode, output, seconds, timed_out

    def tail(self, lines=40):
        return log_tail(self.output, lines)


def log_tail(output, lines=40):
    """The last `lines` lines of a launch's output that the ranks wrote. torchrun's own report of
    a failed worker (its traceback and ChildFailedError table, 40-odd lines) would otherwise fill
    the tail and hide the rank's error; it is cut to the line naming the failed rank."""
    kept = output.splitlines()
    for i, line in enumerate(kept):
        if "torch/distributed/elastic/multiprocessing/api.py" in line and "failed (exitcode" in line:
            kept = kept[:i + 1]
            break
    return "\n".join(kept[-lines:])


def torchrun(nproc, script, args, timeout, log, env=None, module=False):
    """Runs `torchrun --nproc-per-node N --master-port P script args` (with module, `-m script`:
    a module name); output (all ranks) to log."""
    target = ["-m", script] if module else [str(HERE / script)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), *target, *map(str, args)]
    start = time.monotonic()
    with open(log, "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        # A session of its own: on timeout the agent and all its workers are killed together.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(env),
                                start_new_session=True, cwd=HERE)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    return Launch(proc.returncode, Path(log).read_text(errors="replace"), time.monotonic() - start, timed_out)


def launch_checked(nproc, script, args, timeout, out, what, env=None):
    """torchrun(nproc, script, args) with its log at out/log.txt; fails the test, naming `what`,
    when it exits non-zero or any rank wrote out/error.rank<R>.json (worker_common's report)."""
    launch = torchrun(nproc, script, args, timeout, out / "log.txt", env=env)
    errors = [json.loads(p.read_text()) for p in sorted(out.glob("error.rank*.json"))]
    if launch.returncode != 0 or errors:
        detail = "\n".join(f"{e['type']}: {e['message']}" for e in errors)
        pytest.fail(f"{what}: exit {launch.returncode}{' (timed out)' if launch.timed_out else ''}"
                    f"\n{detail}\n--- log tail ---\n{launch.tail()}", pytrace=False)
    return launch


class RankResult:
    def __init__(self, rank, returncode, stderr, timed_out):
        self.rank, self.returncode, self.stderr, self.timed_out = rank, returncode, stderr, timed_out

    def __repr__(self):
        tail = "\n    ".join(self.stderr.strip().splitlines()[-6:])
        return f"rank {self.rank}: exit {self.returncode}{' (timed out)' if self.timed_out else ''}\n    {tail}"


def spawn_ranks(nproc, script, args, timeout, workdir, env=None):
    """Starts nproc processes with torchrun's worker environment; waits for all, killing any
    still running after `timeout` seconds. Returns one RankResult per rank."""
    port, run_id = free_port(), uuid.uuid4().hex[:12]
    procs, files = [], []
    for rank in range(nproc):
        rank_env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
                    "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0"}
        rank_env.update(env or {})
        err = open(Path(workdir) / f"stderr.rank{rank}.txt", "w+")
        files.append(err)
        procs.append(subprocess.Popen([sys.executable, str(HERE / script), *map(str, args)],
                                      stdout=err, stderr=subprocess.STDOUT, env=child_env(rank_env),
                                      start_new_session=True, cwd=HERE))
    deadline = time.monotonic() + timeout
    results = []
    for rank, (proc, err) in enumerate(zip(procs, files)):
        timed_out = False
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        err.seek(0)
        results.append(RankResult(rank, proc.returncode, err.read(), timed_out))
        err.close()
    return results


def one_process(script, args, timeout, env=None):
    """Runs a script as a plain `python script.py` (one rank, no launcher). Returns a RankResult."""
    proc = subprocess.Popen([sys.executable, str(HERE / script), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=child_env(env), start_new_session=True, cwd=HERE,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return RankResult(0, proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return RankResult(0, proc.returncode, proc.stdout.read() if proc.stdout else "", True)


def load_st(path):
    return safetensors.torch.load_file(str(path))


def read_json(path):
    return json.loads(Path(path).read_text())


def zero_to_fp32_binary():
    """The built zero_to_fp32: $ZERO_TO_FP32, else ${BUILD_DIR:-build}/tools/zero_to_fp32, else PATH."""
    candidates = [os.environ.get("ZERO_TO_FP32"),
                  str(Path(os.environ.get("BUILD_DIR", REPO / "build")) / "tools" / "zero_to_fp32"),
                  shutil.which("zero_to_fp32")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    return None


# --- the reference ---------------------------------------------------------------------------

_references = {}


def reference_run(model):
    """(fp32 state dict, losses) of torch.optim.AdamW in one process on the global batch."""
    if model not in _references:
        _references[model] = cases.reference(model)
    return _references[model]


def initial_weights(model):
    return {k: v.detach().clone() for k, v in cases.build(model).state_dict().items()}


# --- comparisons ------------------------------------------------------------------------------

ATOL = RTOL = 1e-5  # fp32 against torch.optim.AdamW, and a resumed run against an uninterrupted one


def assert_same_keys(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: names differ: {sorted(set(a) ^ set(b))}"


def assert_close(actual, expected, what, atol=ATOL, rtol=RTOL):
    assert_same_keys(actual, expected, what)
    bad = []
    for k in sorted(expected):
        a, e = actual[k].float(), expected[k].float()
        assert a.shape == e.shape, f"{what}: {k} has shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        excess = (a - e).abs() - (atol + rtol * e.abs())
        if (excess > 0).any():
            i = int(excess.flatten().argmax())
            bad.append(f"{k}: {a.flatten()[i].item():.9g} vs {e.flatten()[i].item():.9g} at flat index {i}, "
                       f"max |diff| {(a - e).abs().max().item():.3g}")
    assert not bad, f"{what}: {len(bad)} tensors outside atol {atol} rtol {rtol}:\n  " + "\n  ".join(bad[:8])


def assert_bitwise(actual, expected, what):
    assert_same_keys(actual, expected, what)
    bad = []
    for k in sorted(expected):
        a, e = actual[k], expected[k]
        assert a.dtype == e.dtype and a.shape == e.shape, \
            f"{what}: {k} is {a.dtype}{tuple(a.shape)}, expected {e.dtype}{tuple(e.shape)}"
        differ = (a.view(torch.int16 if a.element_size() == 2 else torch.int32)
                  != e.view(torch.int16 if e.element_size() == 2 else torch.int32))
        if differ.any():
            bad.append(f"{k}: {int(differ.sum())} of {differ.numel()} elements differ, "
                       f"max |diff| {(a.float() - e.float()).abs().max().item():.3g}")
    assert not bad, f"{what}: not bitwise equal:\n  " + "\n  ".join(bad[:8])


def assert_trained(final, initial, what, min_change=1e-4):
    """Guards against a vacuous comparison: every tensor moved from its initial value and is
    finite, and the weights are not all zero."""
    assert_same_keys(final, initial, what)
    for k in sorted(initial):
        f = final[k].float()
        assert torch.isfinite(f).all(), f"{what}: {k} has non-finite values"
        change = (f - initial[k].float()).abs().max().item()
        assert change > min_change, f"{what}: {k} moved by at most {change:.3g} from its initial value"
    assert any(final[k].abs().sum() > 0 for k in final), f"{what}: every weight is zero"
