"""What the side-by-side harnesses in this folder share (torch_peers.py, mlp_peers.py).

The driver half: launching a child with a time limit and reading its peak RSS (wait4), launching N
Python workers of a script under `python -m torch.distributed.run`, alternating the runs of every
repeat, medians, markdown tables. The worker half: a rank's identity and one thread, writing and
reading the per-rank result files. Nothing here imports torch, so the driver can start without it.
"""
import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class RunFailed(Exception):
    """A child that exited non-zero or ran out of time; `output` is what it printed."""

    def __init__(self, what, status, output):
        super().__init__(f"{what} failed ({status})")
        self.what, self.status, self.output = what, status, output

    def tail(self, lines=15):
        return "\n".join(self.output.strip().splitlines()[-lines:])


# --- the driver --------------------------------------------------------------------------------

def importable(module, env=None):
    # From / and through initialize: run from the repository root, `import zero` alone would find
    # the C++ sources' zero/ directory as a namespace package.
    return subprocess.run([sys.executable, "-c", f"import {module}; {module}.initialize"], capture_output=True,
                          cwd="/", env=env).returncode == 0


def zero_package_env(library=None):
    """What `import zero` loads in the workers: (environment variables to add, a line saying what
    that is). By default this repository's python/ with the library its build made
    (build/libzero.so.0), so that a run measures the working tree: a package installed into a venv
    earlier stays as it was until scripts/python-env.sh reinstalls it. `library` names another
    libzero.so.0 (python/ still this repository's). Without a build, the installed package."""
    lib = Path(library) if library else REPO / "build" / "libzero.so.0"
    if not lib.is_file():
        if library:
            raise SystemExit(f"--zero-library {library}: no such file")
        return {}, "the installed zero package (this repository has no build/libzero.so.0)"
    path = os.environ.get("PYTHONPATH")
    extra = {"PYTHONPATH": str(REPO / "python") + (os.pathsep + path if path else ""),
             "ZERO_LIBRARY": str(lib.resolve())}
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip() or "no git checkout"
    return extra, f"zero: this repository's python/ at {commit}, library {lib}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_thread_env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", **extra)


def run_child(cmd, what, env=None, timeout=None, cwd=None):
    """Runs cmd to its end: returns (output, rusage), the rusage from wait4 (ru_maxrss: the largest
    of the child and the descendants it waited for, KiB). Raises RunFailed on a non-zero exit or
    when `timeout` seconds pass (then the child's session gets SIGTERM, SIGKILL 10 s later)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        expired = threading.Event()

        def stop(sig):
            expired.set()
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

        timers = [threading.Timer(timeout, stop, (signal.SIGTERM,)), threading.Timer(timeout + 10, stop, (signal.SIGKILL,))] \
            if timeout else []
        for t in timers:
            t.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            for t in timers:
                t.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        text = out.read()
    if expired.is_set():
        raise RunFailed(what, f"no end after {timeout:g} s", text)
    if proc.returncode != 0:
        raise RunFailed(what, f"exit {proc.returncode}", text)
    return text, usage


def torchrun(script, nproc, worker_args, what, timeout, env=None):
    """N processes of `script worker_args...` under torch.distributed.run (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT set; one OpenMP thread each). Returns the launcher's output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), os.path.abspath(script), *worker_args]
    try:
        return run_child(cmd, what, env=env or one_thread_env(), timeout=timeout)[0]
    except RunFailed as e:
        # The launcher ends with its own traceback and a report box: keep what the workers printed,
        # and of the box the lines naming each failed rank's exit code.
        end = e.output.rfind("ChildFailedError")
        start = e.output.rfind("Traceback (most recent call last):", 0, end)
        if end >= 0 and start >= 0:
            codes = [line.strip() for line in e.output[end:].splitlines() if "exitcode" in line]
            e.output = e.output[:start] + "\n".join(["torch.distributed.run:", *codes])
        raise


def round_order(labels, index):
    """The labels in the order repeat `index` runs them: every other repeat reversed (A B C, C B A,
    A B C ...), so that no label always runs right after the same one."""
    return labels if index % 2 == 0 else labels[::-1]


def alternate(name, repeats, labels, run_one, keep_going=False):
    """Every repeat runs every label once (in round_order), so a machine busy with something else
    slows all alike. run_one(label, index) returns a dict with "ms_step". A failed run prints its
    tail and ends the harness (exit 1), or with keep_going is recorded and skipped."""
    runs = []
    for index in range(repeats):
        for label in round_order(labels, index):
            try:
                run = run_one(label, index)
            except RunFailed as e:
                message = f"{name}: repeat {index + 1}/{repeats} {label} failed ({e.status}):\n{e.tail()}"
                if not keep_going:
                    raise SystemExit(message)
                print(f"{message}\n{name}: --keep-going: recorded, going on", file=sys.stderr)
                run = {"failed": True, "status": e.status, "output_tail": e.tail(40)}
            else:
                print(f"{name}: repeat {index + 1}/{repeats} {label}: {run['ms_step']:.1f} ms/step", file=sys.stderr)
            runs.append(dict(run, label=label, repeat=index))
    return runs


def median_of(runs, key):
    values = [r[key] for r in runs if not r.get("failed")]
    return statistics.median(values) if values else None


def run_flags(p, repeats, timeout, peers, stages_help):
    """The flags every harness here has; the caller adds its own."""
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--stages", default="0,1,2,3", help=stages_help)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--peers", default=peers, help="which to run; those that cannot run here are left out, with a message")
    p.add_argument("--timeout", type=float, default=timeout, help="seconds for one run")
    p.add_argument("--json", help="also write every run and the summary here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)


def markdown_table(headers, rows, left=1):
    """Lines of a markdown table; the first `left` columns aligned left, the others right."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# --- the workers -------------------------------------------------------------------------------

def worker_rank():
    """(rank, world size) from the launcher's environment; this process computes on one thread."""
    import torch

    torch.set_num_threads(1)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class StepBarrier:
    """A barrier of a torchrun job's workers outside any peer's own communication: counters in the
    launcher's TCP store (MASTER_ADDR/MASTER_PORT), under keys of their own. What lines the ranks
    up before each timed part of a step, so that no rank's part starts with its peer's lag."""

    def __init__(self, world):
        from datetime import timedelta

        import torch.distributed as dist

        self.world, self.count = world, 0
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                   is_master=False, timeout=timedelta(seconds=300))

    def wait(self):
        key = f"peers_step_barrier/{self.count}"
        self.count += 1
        if self.store.add(key, 1) == self.world:
            self.store.set(key + "/open", "1")
        self.store.wait([key + "/open"])


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_rank(out, rank, result):
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)


def exit_worker():
    """Leaves a worker at once, after its result is written, without the interpreter's and the C++
    libraries' teardown: in about one run of three, DeepSpeed's ranks abort there ("terminate
    called without an active exception", no Python frame left), and the run would count as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def read_ranks(out, nproc, time_keys):
    """The ranks' results as one: the slowest rank's times (collectives keep the ranks in step, so
    the slowest rank's step is the step), every rank's peak RSS, the mean of the last losses."""
    ranks = []
    for r in range(nproc):
        with open(f"{out}.rank{r}.json") as f:
            ranks.append(json.load(f))
    merged = {key: max(r[key] for r in ranks) for key in time_keys}
    merged["peak_rss_mib"] = [r["peak_rss_mib"] for r in ranks]
    merged["last_loss"] = sum(r["last_loss"] for r in ranks) / len(ranks)
    return merged, ranks


def ratio_or_refusal(num, den, num_name, den_name, what, cause=""):
    """(num / den, None), or (None, reason) when the ratio would mislead: a baseline `den` that is
    not positive, or a negative `num` (either reads as a win). Both are ms of `what` (e.g. "engine
    share"); the names say whose they are, `cause` what likely went wrong, for the reason."""
    if num is None or den is None:
        return None, f"not measurable: no {what} for {num_name if num is None else den_name}"
    if den <= 0:
        return None, f"not measurable: {den_name}'s {what} is {den:.1f} ms, not positive{cause}"
    if num < 0:
        return None, f"not measurable: {num_name}'s {what} is {num:.1f} ms, negative{cause}"
    return num / den, None
