#!/usr/bin/env python3
"""zero against its PyTorch peers: the same model, data and AdamW trained on N processes (CPU,
torchrun) by zero (ZeRO stages), PyTorch DDP (gloo), PyTorch FSDP2 (fully_shard, gloo) and
DeepSpeed when it imports. Runs alternate (A B C, C B A, ...) so that a machine busy with something
else slows every peer alike; each figure is the median over repeats of a run's median step.

Per run: ms per step; forward and backward ms as the peer runs them (with its hooks, its
all-gathers and the reductions it overlaps with backward); the time outside them (optimizer step
and whatever communication the peer does not overlap with backward); the engine's share: ms per
step minus the step of a *bare* run, launched the same way (N processes at once, same model,
batches, forward, loss and backward; no wrapper, no optimizer, no process group), so work a peer
moves into forward or backward counts as its own, as benchmarks/peers/mlp_peers.py measures it;
peak RSS per process (getrusage); the last step's loss, checked to agree between peers (fp32:
same model and data, so the same trajectory up to summation order; the bare run does not train
and is not compared). For each zero stage the driver prints, against the best (fastest) of DDP,
FSDP2 and DeepSpeed at that stage, two ratios side by side: the whole step (zero's ms/step over
the peer's) and the engine share (zero's share over the peer's). A share is a difference of two
noisy medians and can come out negative when the bare run was slow in a noisy moment; an engine
ratio whose baseline (the peer's share) is not positive, or whose numerator (zero's share) is
negative, would read as a win, so the driver prints none: it says why instead (JSON: "ratio" null,
"ratio_refused" the reason).

Paired bare steps (--paired, the default): every peer's processes also build the bare model (same
seed) and run a bare step on the same batch beside each of the peer's steps, before it on even
steps and after it on odd ones, the ranks lined up before each. The paired engine share is the
median over steps of the job's step less its bare step (each the slowest rank's), then the median
over repeats; the paired backward ratio likewise. Both sides of each difference see the same
moment of the machine, so a machine that speeds up or slows down between runs no longer moves the
share as it moves a difference of two runs' medians; with pairing the ratios take these shares,
against the peer with the smallest one. (In zero's stage-3 processes the bare model's parameter reads also pass zero's attribute
watch, nn.Module.__getattr__ patched while a stage-3 engine lives: a type check per read.)

Besides wall time, each step's process CPU time (every thread of the rank, its communication
threads included; time the host gives to other guests does not count), and the engine's CPU share
against the bare run's: on a machine whose other tenants make wall times noisy, the steadier
measure of the work an engine adds. For zero, engine.timings() per step (the C++ engine's phases
and the Python hooks and checks), and each stage's time outside forward and backward against the
optimizer's own traffic limit for the rank's partition (zero-bench kernels' traffic probe, run on
as many processes at once as there are ranks).

  python benchmarks/peers/torch_peers.py [--model mlp|transformer|transformer-25m] [--dtype fp32|bf16]
                                         [--steps 20] [--repeats 3] [--stages 0,1,2,3] [--nproc 2]
                                         [--json out.json] [--zero-bench build/benchmarks/zero-bench]
                                         [--zero-library build/libzero.so.0]
                                         [--no-paired] [--overlap-comm default|on|off]
                                         [--check-grad-overflow default|on|off]
                                         [--stage3-persistence default|all]

Comparable pairs: zero stage 0 with DDP (both replicate everything), zero stages 1-3 with FSDP2
(which shards parameters, gradients and optimizer state: stage 3's layout).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import common  # noqa: E402
from torch_peers_report import PAIRED, TIMES, engine_ratios, markdown, optimizer_limits  # noqa: E402

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
# Peers train the same model on the same data: their last losses agree but for summation order
# (fp32), or for where each rounds to bf16 (bf16: DDP and FSDP2 keep fp32 parameters).
LOSS_SPREAD = {"fp32": 1e-4, "bf16": 3e-2}


# --- models: sized so that one run of ~20 steps takes seconds on one CPU core per process ------

class MLP(torch.nn.Sequential):
    WIDTH, LAYERS, BATCH = 1024, 4, 32  # ~4.2M parameters; BATCH is per process

    def __init__(self):
        layers = []
        for _ in range(self.LAYERS):
            layers += [torch.nn.Linear(self.WIDTH, self.WIDTH), torch.nn.GELU()]
        super().__init__(*layers, torch.nn.Linear(self.WIDTH, 16))

    def blocks(self):
        return [m for m in self if isinstance(m, torch.nn.Linear)]

    @classmethod
    def batch(cls, g):
        return torch.randn(cls.BATCH, cls.WIDTH, generator=g), torch.randn(cls.BATCH, 16, generator=g)

    @staticmethod
    def loss(out, y):
        return torch.nn.functional.mse_loss(out.float(), y)


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class Transformer(torch.nn.Module):
    VOCAB, SEQ, D, HEADS, LAYERS, BATCH = 2048, 64, 256, 4, 4, 8  # ~3.7M parameters, tied head

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(self.VOCAB, self.D)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = torch.nn.Parameter(torch.randn(self.SEQ, self.D) * 0.02)
        self.layers = torch.nn.ModuleList(Block(self.D, self.HEADS) for _ in range(self.LAYERS))
        self.ln_f = torch.nn.LayerNorm(self.D)
        self.lm_head = torch.nn.Linear(self.D, self.VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))

    def blocks(self):
        return list(self.layers)

    @classmethod
    def batch(cls, g):
        seq = torch.randint(0, cls.VOCAB, (cls.BATCH, cls.SEQ + 1), generator=g)
        return seq[:, :-1], seq[:, 1:]

    @classmethod
    def loss(cls, out, y):
        return torch.nn.functional.cross_entropy(out.float().reshape(-1, cls.VOCAB), y.reshape(-1))


class Transformer25M(Transformer):
    D, HEADS, LAYERS, BATCH = 512, 8, 8, 4  # ~26.3M parameters, tied head


MODELS = {"mlp": MLP, "transformer": Transformer, "transformer-25m": Transformer25M}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# --overlap-comm: zero_optimization.overlap_comm for zero and DeepSpeed ("default": the key left out);
# --check-grad-overflow likewise for bf16.check_grad_overflow.
OVERLAP = {"default": None, "on": True, "off": False}
# --stage3-persistence all: both persistence thresholds above any model's size, so that stage 3
# keeps every unit gathered (each rank a whole model copy, as at stages 0-2) and gathers nothing
# per step: what stage 3 costs besides its gathers.
PERSIST_ALL_ELEMS = 10**15


# --- one rank of one run (under torchrun) ------------------------------------------------------

def zero_config(stage, micro_batch, dtype="fp32", overlap_comm=None, check_grad_overflow=None,
                persist_all=False):
    # No clipping: DDP and FSDP2 run plain AdamW (written out: DeepSpeed >= 0.19.3 clips at 1.0 unless told).
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                        "weight_decay": WEIGHT_DECAY}},
              "zero_optimization": {"stage": stage}}
    if overlap_comm is not None:  # else DeepSpeed's default: on at stage 3 only
        config["zero_optimization"]["overlap_comm"] = overlap_comm
    if persist_all and stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = PERSIST_ALL_ELEMS
        config["zero_optimization"]["stage3_model_persistence_threshold"] = PERSIST_ALL_ELEMS
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
        if check_grad_overflow is not None:  # else DeepSpeed's default: on (0.19.3 and later)
            config["bf16"]["check_grad_overflow"] = check_grad_overflow
    return config


def make_trainer(peer, model, cls, dtype="fp32", overlap_comm=None, check_grad_overflow=None,
                 persist_all=False):
    """Returns (forward, backward, step) closures for one peer. bf16: zero and DeepSpeed train the
    model in bf16 with fp32 master weights (their bf16 config), DDP and FSDP2 keep fp32 parameters
    and compute in bf16 (DDP under torch.autocast, FSDP2 with its mixed-precision policy), the bare
    run computes on a bf16 model."""
    kind, _, stage = peer.partition("-s")
    bf16 = dtype == "bf16"
    if kind == "bare":
        if bf16:
            model.to(torch.bfloat16)

        def drop_grads():
            for p in model.parameters():
                p.grad = None

        return model, lambda loss: loss.backward(), drop_grads
    if kind in ("zero", "deepspeed"):
        lib = __import__("zero" if kind == "zero" else "deepspeed")
        engine, *_ = lib.initialize(model=model, model_parameters=model.parameters(),
                                    config=zero_config(int(stage), cls.BATCH, dtype, overlap_comm,
                                                       check_grad_overflow, persist_all))
        return engine, engine.backward, engine.step
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 \
            else MixedPrecisionPolicy()
        for block in model.blocks():
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        raise SystemExit(f"unknown peer {peer}")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    def autocast_forward(x):
        # DDP's own mixed precision needs CUDA streams: on the CPU, autocast computes in bf16.
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    forward = autocast_forward if bf16 and kind == "ddp" else model
    return forward, lambda loss: loss.backward(), step


def per_step(timings, steps):
    """engine.timings() over `steps` steps as per-step figures: seconds as ms, counts as counts."""
    out = {}
    for key, value in timings.items():
        if isinstance(value, dict):
            out.update(per_step({f"{key}.{k}": v for k, v in value.items()}, steps))
        elif key.endswith("_s"):
            out[key[:-2] + "_ms"] = value * 1e3 / steps
        else:
            out[key] = value / steps
    return out


def bare_trainer(cls, dtype):
    """The paired bare model: the peer's model as built (same seed), no wrapper, no optimizer; its
    (forward, step) where step drops the gradients its backward made."""
    torch.manual_seed(0)
    model = cls()
    if dtype == "bf16":
        model.to(torch.bfloat16)

    def drop_grads():
        for p in model.parameters():
            p.grad = None

    return model, drop_grads


# The engine's phases that run in step(), after backward (engine.timings() keys, seconds): the
# job's time outside forward and backward is split into these per step (outside_phases()).
OUTSIDE_PHASES = ("reduce_wait_s", "optimizer_s", "norm_s", "all_gather_s")


def phase_seconds(timings):
    """The cumulative seconds of OUTSIDE_PHASES in an engine.timings() dict (0 for a missing key)."""
    return [float(timings.get(k, 0.0)) for k in OUTSIDE_PHASES]


def timed_step(forward, backward, step, loss_of, x, y):
    """One step, timed: (loss, (step, forward, backward, outside, CPU time) in seconds)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    loss = loss_of(forward(x), y)
    t1 = time.perf_counter()
    backward(loss)
    t2 = time.perf_counter()
    step()
    t3 = time.perf_counter()
    return loss, (t3 - t0, t1 - t0, t2 - t1, t3 - t2, time.process_time() - c0)


def worker(args):
    rank, world = common.worker_rank()
    cls = MODELS[args.model]
    paired = args.paired and args.worker != "bare"
    # The paired bare model first: the peer's model then comes from the same seed as without it.
    bare_forward, bare_step = bare_trainer(cls, args.dtype) if paired else (None, None)
    torch.manual_seed(0)
    model = cls()
    forward, backward, step = make_trainer(args.worker, model, cls, args.dtype, OVERLAP[args.overlap_comm],
                                           OVERLAP[args.check_grad_overflow],
                                           args.stage3_persistence == "all")
    profiled = hasattr(forward, "timings") and args.worker.startswith("zero")
    # Each rank its own micro-batches, made before timing starts.
    g = torch.Generator().manual_seed(1000 + rank)
    batches = [cls.batch(g) for _ in range(args.warmup + args.steps)]
    times, bare_times = [], []
    phases, seen = [], None  # per timed step, OUTSIDE_PHASES' seconds in that step
    # With --paired the ranks line up before each bare step and each of the peer's steps: a rank
    # that finished its bare step early would otherwise start the peer's step ahead and wait in its
    # first collective, which would count as the peer's.
    barrier = common.StepBarrier(world) if paired and world > 1 else None

    def run_bare(x, y):
        if barrier:
            barrier.wait()
        _, bare = timed_step(bare_forward, lambda loss: loss.backward(), bare_step, cls.loss, x, y)
        if barrier:
            barrier.wait()
        return bare

    for i, (x, y) in enumerate(batches):
        if i == args.warmup and profiled:
            forward.timings(reset=True)
        # With --paired, a bare step on the same batch beside each of the peer's steps, before it
        # on even steps and after it on odd ones: both see the same moment of the machine.
        if paired and i % 2 == 0:
            bare = run_bare(x, y)
        loss, mine = timed_step(forward, backward, step, cls.loss, x, y)
        if paired and i % 2 == 1:
            bare = run_bare(x, y)
        if i >= args.warmup:
            times.append(mine)
            if paired:
                bare_times.append(bare)
            if profiled:  # read after the timed step, so not inside it
                now = phase_seconds(forward.timings())
                phases.append([a - b for a, b in zip(now, seen or [0.0] * len(now))])
                seen = now
    med = [statistics.median(t[j] for t in times) * 1e3 for j in range(5)]
    result = {"rank": rank, "world": world, "ms_step": med[0], "ms_forward": med[1], "ms_backward": med[2],
              "ms_outside": med[3], "cpu_ms_step": med[4], "peak_rss_mib": common.peak_rss_mib(), "last_loss": loss.item()}
    if paired:
        result["steps"], result["bare_steps"] = times, bare_times  # paired_figures() takes them
    if profiled:
        result["profile"] = per_step(forward.timings(), args.steps)
        if paired:
            result["phase_steps"] = phases
        result["zero_package"] = os.path.dirname(os.path.abspath(sys.modules["zero"].__file__))
    common.write_rank(args.out, rank, result)
    common.exit_worker()


# --- the driver --------------------------------------------------------------------------------

def paired_figures(ranks):
    """The run's figures against its paired bare steps. Step i of the job takes as long as its
    slowest rank's (the collectives wait for it), so does the job's bare step i: the paired engine
    share is the median over steps of (the slowest rank's step i) - (the slowest rank's bare step
    i), the backward ratio likewise. (Per rank, a rank that is faster than its peer would count
    the wait for it as its engine's, since its own bare steps do not wait.)"""
    def job(key, j):
        return [max(r[key][i][j] for r in ranks) for i in range(len(ranks[0][key]))]

    step, bare = job("steps", 0), job("bare_steps", 0)
    cpu, bare_cpu = job("steps", 4), job("bare_steps", 4)
    backward, bare_backward = job("steps", 2), job("bare_steps", 2)
    # The job's time outside forward and backward: its step less the slowest rank's forward and
    # backward (a faster rank's wait for that one is inside them).
    fwd_bwd = [max(r["steps"][i][1] + r["steps"][i][2] for r in ranks) for i in range(len(step))]
    return {"ms_outside_job": statistics.median(a - b for a, b in zip(step, fwd_bwd)) * 1e3,
            "ms_engine_paired": statistics.median(a - b for a, b in zip(step, bare)) * 1e3,
            "cpu_ms_engine_paired": statistics.median(a - b for a, b in zip(cpu, bare_cpu)) * 1e3,
            "backward_over_paired_bare": statistics.median(a / b for a, b in zip(backward, bare_backward)),
            "ms_paired_bare_step": statistics.median(bare) * 1e3}


def outside_phases(ranks):
    """Where the job's time outside forward and backward went, per step as the rank that finished
    its forward and backward last spent it (the step waits for that rank; a faster rank's wait for
    it is not outside): {phase in ms: median over steps}, OUTSIDE_PHASES' names with _ms, plus
    "rest_ms", the job's outside time less those phases (the package's Python, the parameter
    check, the other rank's lag in step()). Its reduce_wait is the reduction itself as far as that
    rank had to wait for it, not a faster rank's wait for the slower one."""
    steps = range(len(ranks[0]["steps"]))
    per_key = {k[:-2] + "_ms": [] for k in OUTSIDE_PHASES}
    rest = []
    for i in steps:
        last = max(ranks, key=lambda r: r["steps"][i][1] + r["steps"][i][2])
        outside = max(r["steps"][i][0] for r in ranks) - (last["steps"][i][1] + last["steps"][i][2])
        spent = last["phase_steps"][i]
        for key, seconds in zip(per_key, spent):
            per_key[key].append(seconds)
        rest.append(outside - sum(spent))
    out = {k: statistics.median(v) * 1e3 for k, v in per_key.items()}
    out["rest_ms"] = statistics.median(rest) * 1e3
    return out


def run_once(args, peer, workdir, index):
    out = os.path.join(workdir, f"{peer}.{index}")
    common.torchrun(__file__, args.nproc, ["--worker", peer, "--out", out, "--model", args.model,
                                           "--dtype", args.dtype, "--steps", str(args.steps),
                                           "--warmup", str(args.warmup),
                                           "--paired" if args.paired else "--no-paired",
                                           "--overlap-comm", args.overlap_comm,
                                           "--check-grad-overflow", args.check_grad_overflow,
                                           "--stage3-persistence", args.stage3_persistence],
                    peer, args.timeout, env=common.one_thread_env(**args.zero_env))
    run, ranks = common.read_ranks(out, args.nproc, TIMES)
    mine = os.path.join(common.REPO, "python", "zero")
    if args.zero_env and ranks[0].get("zero_package", mine) != mine:
        raise SystemExit(f"torch_peers: {peer}'s workers imported zero from {ranks[0]['zero_package']}, "
                         f"not this repository's {mine}")
    if "steps" in ranks[0]:
        run.update(paired_figures(ranks))
    if "profile" in ranks[0]:
        # Per key the slowest rank's figure, as for the times.
        run["profile"] = {k: max(r["profile"][k] for r in ranks) for k in ranks[0]["profile"]}
        run["profile_per_rank"] = [r["profile"] for r in ranks]  # (--json) the wait is one rank's lag
    if "phase_steps" in ranks[0]:
        run["outside_phases"] = outside_phases(ranks)
    return dict(run, peer=peer)


def summarise(runs, peers):
    rows = []
    for peer in peers:
        mine = [r for r in runs if r["peer"] == peer]
        row = {"peer": peer}
        for key in TIMES + PAIRED:
            if key in mine[0]:
                row[key] = common.median_of(mine, key)
        row["peak_rss_mib"] = statistics.median(max(r["peak_rss_mib"]) for r in mine)
        row["last_loss"] = mine[0]["last_loss"]
        profiles = [r["profile"] for r in mine if "profile" in r]
        if profiles:
            row["profile"] = {k: statistics.median(p[k] for p in profiles) for k in profiles[0]}
        phases = [r["outside_phases"] for r in mine if "outside_phases" in r]
        if phases:
            row["outside_phases"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        rows.append(row)
    bare = next((r for r in rows if r["peer"] == "bare"), None)
    for r in rows:
        if bare is not None and r is not bare:
            r["ms_engine"] = r["ms_step"] - bare["ms_step"]
            r["cpu_ms_engine"] = r["cpu_ms_step"] - bare["cpu_ms_step"]
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                   help="bf16: zero and DeepSpeed with their bf16 config, DDP and FSDP2 in mixed precision")
    p.add_argument("--zero-bench", help="zero-bench for the optimizer's traffic limit (default: build/)")
    common.run_flags(p, repeats=3, timeout=600, peers="zero,ddp,fsdp2,deepspeed,bare",
                     stages_help="ZeRO stages for zero (and DeepSpeed)")
    p.add_argument("--paired", action=argparse.BooleanOptionalAction, default=True,
                   help="a bare step beside each of a peer's steps, in the same processes: engine "
                        "shares as the median of the per-step differences (default: on)")
    p.add_argument("--zero-library", help="the libzero.so.0 zero's workers load, with this repository's "
                                          "python/ (default: build/libzero.so.0; without one, the "
                                          "installed zero package)")
    p.add_argument("--overlap-comm", choices=sorted(OVERLAP), default="default",
                   help="zero_optimization.overlap_comm for zero and DeepSpeed (default: the key left "
                        "out, so DeepSpeed's default: on at stage 3, off at 0-2)")
    p.add_argument("--check-grad-overflow", choices=sorted(OVERLAP), default="default",
                   help="with --dtype bf16: bf16.check_grad_overflow for zero and DeepSpeed (default: "
                        "the key left out, so DeepSpeed's default: on)")
    p.add_argument("--stage3-persistence", choices=("default", "all"), default="default",
                   help="all: stage 3 for zero and DeepSpeed with both persistence thresholds above "
                        "the model's size, so that every unit stays gathered (a whole model copy per "
                        "rank) and nothing is gathered per step (default: the keys left out)")
    args = p.parse_args()
    if args.worker:
        return worker(args)

    wanted = args.peers.split(",")
    args.zero_env, args.zero_what = common.zero_package_env(args.zero_library)
    print(f"torch_peers: {args.zero_what}", file=sys.stderr)
    stages = [int(s) for s in args.stages.split(",") if s]
    available = {k: k in wanted for k in ("ddp", "fsdp2")}
    for kind in ("zero", "deepspeed"):
        available[kind] = kind in wanted and common.importable(kind, common.one_thread_env(**args.zero_env))
        if kind in wanted and not available[kind]:
            print(f"torch_peers: {kind} does not import with {sys.executable}: left out", file=sys.stderr)
    peers = ([f"zero-s{s}" for s in stages if available["zero"]] + [k for k in ("ddp", "fsdp2") if available[k]]
             + [f"deepspeed-s{s}" for s in stages if available["deepspeed"]])
    if peers and "bare" in wanted:
        peers.append("bare")
    if not peers:
        raise SystemExit("torch_peers: no peer to run")
    with tempfile.TemporaryDirectory() as workdir:
        runs = common.alternate("torch_peers", args.repeats, peers,
                                lambda peer, index: run_once(args, peer, workdir, index))
    rows = summarise(runs, peers)
    numel = sum(p.numel() for p in MODELS[args.model]().parameters())
    args.limits = optimizer_limits(args, [s for s in stages], numel) if available["zero"] and stages else None
    losses = [r["last_loss"] for r in rows if r["peer"] != "bare"]
    spread = (max(losses) - min(losses)) / max(abs(min(losses)), 1e-12)
    print(markdown(rows, args, numel))
    allowed = LOSS_SPREAD[args.dtype]
    if spread > allowed:
        print(f"\nWARNING: the peers' last losses differ by {spread:.2%}: they did not train the same model",
              file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "nproc": args.nproc, "steps": args.steps, "warmup": args.warmup,
                       "repeats": args.repeats, "torch": torch.__version__, "summary": rows, "runs": runs,
                       "dtype": args.dtype, "overlap_comm": args.overlap_comm,
                       "check_grad_overflow": args.check_grad_overflow,
                       "stage3_persistence": args.stage3_persistence, "zero_under_test": args.zero_what, "optimizer_limits": args.limits,
                       "engine_ratios": {str(k): v for k, v in engine_ratios(rows).items()},
                       "last_loss_spread": spread}, f, indent=1)
    return 1 if spread > allowed else 0


if __name__ == "__main__":
    sys.exit(main())
