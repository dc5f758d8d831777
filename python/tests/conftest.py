"""Session-wide launches shared by the tests: ONE torchrun per (model, world size), which trains
every stage x dtype (worker_train.py), started the first time a test asks for it."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cases  # noqa: E402
import harness  # noqa: E402

# A package that does not import fails the whole suite here, before any test runs.
import zero  # noqa: E402

if not hasattr(zero, "initialize"):  # e.g. the repository's C++ zero/ taken as a namespace package
    raise ImportError(f"`import zero` found {list(getattr(zero, '__path__', []))}, not the package: "
                      "run scripts/python-env.sh")

torch.set_num_threads(1)  # the reference runs in this process: one thread, as in the workers

# Twelve runs of 20 steps each, plus process start-up; generous, as CI may share its 2 cores.
TRAIN_TIMEOUT_S = 600

# The resume tests: (model, world, stage) saves an fp32 checkpoint after MID_STEP steps, and the
# launch for (model, load world) loads it into an engine of the load stage and trains on to STEPS.
# A launch that loads starts after the one that saves; the chains have no cycle.
MID_STEP = 10
RESUMES = [(("mlp", 2, 1), (3, 3)), (("mlp", 3, 3), (1, 0)),
           (("transformer", 3, 2), (2, 3)), (("transformer", 1, 3), (3, 1))]


def pytest_report_header(config):
    return [f"zero {getattr(zero, '__version__', '?')} from {Path(zero.__file__).parent}, torch {torch.__version__}"]


class TrainRun:
    """What one worker_train.py launch wrote (see its docstring)."""

    def __init__(self, model, world, out, launch):
        self.model, self.world, self.out, self.launch = model, world, Path(out), launch

    def require(self, names):
        """Fails the calling test unless every rank wrote the results of the runs `names`."""
        missing = [f"{n}.rank{r}.json" for n in names for r in range(self.world)
                   if not (self.out / f"{n}.rank{r}.json").exists()]
        if not missing:
            return
        errors = []
        for p in sorted(self.out.glob("error.rank*.json")):
            e = json.loads(p.read_text())
            errors.append(f"  {p.stem.split('.')[1]}: {e['type']}: {e['message']}")
        state = "timed out" if self.launch.timed_out else f"exit {self.launch.returncode}"
        pytest.fail(f"{self.model} on {self.world} ranks: no {', '.join(missing[:3])}; torchrun {state} after "
                    f"{self.launch.seconds:.0f} s\n" + "\n".join(errors) + f"\n--- log tail ---\n{self.launch.tail()}",
                    pytrace=False)

    def master(self, stage, dtype, resumed=False):
        return harness.load_st(self.out / f"{'resume-' if resumed else ''}{stage}-{dtype}.master.safetensors")

    def module(self, stage, dtype):
        return harness.load_st(self.out / f"{stage}-{dtype}.module.safetensors")

    def info(self, stage, dtype, rank=0, resumed=False):
        return harness.read_json(self.out / f"{'resume-' if resumed else ''}{stage}-{dtype}.rank{rank}.json")

    def ckpt(self, stage, dtype, mid=False):
        return self.out / "ckpt" / (f"{stage}-{dtype}" + ("-mid" if mid else ""))


ALL_RUNS = [f"{s}-{d}" for d in cases.DTYPES for s in cases.STAGES]


class Runs:
    def __init__(self, base):
        self.base, self.cache = Path(base), {}

    def launch(self, model, world):
        key = (model, world)
        if key not in self.cache:
            saves = [f"{s}:fp32@{MID_STEP}" for (m, w, s), _ in RESUMES if (m, w) == key]
            resumes = [f"{ls}:fp32@{self.launch(m, w).ckpt(s, 'fp32', mid=True)}"
                       for (m, w, s), (lw, ls) in RESUMES if (m, lw) == key]
            out = self.base / f"{model}-w{world}"
            out.mkdir()
            args = ["--model", model, "--out", out, "--save-mid", ",".join(saves), "--resume", ",".join(resumes)]
            launch = harness.torchrun(world, "worker_train.py", args, TRAIN_TIMEOUT_S, out / "log.txt")
            self.cache[key] = TrainRun(model, world, out, launch)
        return self.cache[key]

    def train(self, model, world):
        """The launch for (model, world), after it wrote the results of every stage x dtype."""
        run = self.launch(model, world)
        run.require(ALL_RUNS)
        return run


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("runs"))
