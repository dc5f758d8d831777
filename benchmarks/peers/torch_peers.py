#!/usr/bin/env python3
"""zero against its PyTorch peers: the same model, data and AdamW trained on N processes (CPU,
torchrun) by zero (ZeRO stages), PyTorch DDP (gloo), PyTorch FSDP2 (fully_shard, gloo) and
DeepSpeed when it imports. Runs alternate (A B C A B C ...) so that a machine busy with something
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

Comparable pairs: zero stage 0 with DDP (both replicate everything), zero stages 1-3 with FSDP2
(which shards parameters, gradients and optimizer state: stage 3's layout).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import common  # noqa: E402

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


# --- one rank of one run (under torchrun) ------------------------------------------------------

def zero_config(stage, micro_batch, dtype="fp32"):
    # No clipping: DDP and FSDP2 run plain AdamW (written out: DeepSpeed >= 0.19.3 clips at 1.0 unless told).
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                        "weight_decay": WEIGHT_DECAY}},
              "zero_optimization": {"stage": stage}}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def make_trainer(peer, model, cls, dtype="fp32"):
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
                                    config=zero_config(int(stage), cls.BATCH, dtype))
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


def worker(args):
    rank, world = common.worker_rank()
    cls = MODELS[args.model]
    torch.manual_seed(0)
    model = cls()
    forward, backward, step = make_trainer(args.worker, model, cls, args.dtype)
    profiled = hasattr(forward, "timings") and args.worker.startswith("zero")
    # Each rank its own micro-batches, made before timing starts.
    g = torch.Generator().manual_seed(1000 + rank)
    batches = [cls.batch(g) for _ in range(args.warmup + args.steps)]
    times = []
    for i, (x, y) in enumerate(batches):
        if i == args.warmup and profiled:
            forward.timings(reset=True)
        c0 = time.process_time()
        t0 = time.perf_counter()
        loss = cls.loss(forward(x), y)
        t1 = time.perf_counter()
        backward(loss)
        t2 = time.perf_counter()
        step()
        t3 = time.perf_counter()
        c3 = time.process_time()
        if i >= args.warmup:
            times.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2, c3 - c0))
    med = [statistics.median(t[j] for t in times) * 1e3 for j in range(5)]
    result = {"rank": rank, "world": world, "ms_step": med[0], "ms_forward": med[1], "ms_backward": med[2],
              "ms_outside": med[3], "cpu_ms_step": med[4], "peak_rss_mib": common.peak_rss_mib(), "last_loss": loss.item()}
    if profiled:
        result["profile"] = per_step(forward.timings(), args.steps)
    common.write_rank(args.out, rank, result)
    common.exit_worker()


# --- the driver --------------------------------------------------------------------------------

TIMES = ("ms_step", "ms_forward", "ms_backward", "ms_outside", "cpu_ms_step")


def run_once(args, peer, workdir, index):
    out = os.path.join(workdir, f"{peer}.{index}")
    common.torchrun(__file__, args.nproc, ["--worker", peer, "--out", out, "--model", args.model,
                                           "--dtype", args.dtype, "--steps", str(args.steps),
                                           "--warmup", str(args.warmup)],
                    peer, args.timeout)
    run, ranks = common.read_ranks(out, args.nproc, TIMES)
    if "profile" in ranks[0]:
        # Per key the slowest rank's figure, as for the times.
        run["profile"] = {k: max(r["profile"][k] for r in ranks) for k in ranks[0]["profile"]}
    return dict(run, peer=peer)


def summarise(runs, peers):
    rows = []
    for peer in peers:
        mine = [r for r in runs if r["peer"] == peer]
        row = {"peer": peer}
        for key in TIMES:
            row[key] = common.median_of(mine, key)
        row["peak_rss_mib"] = statistics.median(max(r["peak_rss_mib"]) for r in mine)
        row["last_loss"] = mine[0]["last_loss"]
        profiles = [r["profile"] for r in mine if "profile" in r]
        if profiles:
            row["profile"] = {k: statistics.median(p[k] for p in profiles) for k in profiles[0]}
        rows.append(row)
    bare = next((r for r in rows if r["peer"] == "bare"), None)
    for r in rows:
        if bare is not None and r is not bare:
            r["ms_engine"] = r["ms_step"] - bare["ms_step"]
            r["cpu_ms_engine"] = r["cpu_ms_step"] - bare["cpu_ms_step"]
    return rows


NOISY = " (the bare run was as slow or slower in a noisy moment); rerun with more --repeats"


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


def engine_ratios(rows):
    """{zero stage: {...}} for every zero row that has a peer at its stage (DDP counts at stage 0,
    FSDP2 at 3, DeepSpeed at its own), against the best peer: the one with the shortest step (with
    a bare run, also the smallest engine share, since every share subtracts the same bare step).
    Keys: zero_ms, best_peer, best_peer_ms (engine shares, None without a bare run), ratio (their
    ratio, or None) and ratio_refused (why None, else None); zero_step_ms, best_peer_step_ms and
    step_ratio (the whole steps' ratio, or None) and step_ratio_refused."""
    by_peer = {r["peer"]: r for r in rows if r["peer"] != "bare"}
    out = {}
    for peer, r in by_peer.items():
        kind, _, stage = peer.partition("-s")
        if kind != "zero":
            continue
        others = [p for p in ("ddp", "fsdp2", f"deepspeed-s{stage}") if p in by_peer]
        if not others:
            continue
        best = min(others, key=lambda p: by_peer[p]["ms_step"])
        mine, theirs = r.get("ms_engine"), by_peer[best].get("ms_engine")
        engine, engine_why = ratio_or_refusal(mine, theirs, "zero", best, "engine share", NOISY)
        step, step_why = ratio_or_refusal(r["ms_step"], by_peer[best]["ms_step"], "zero", best, "step")
        out[int(stage)] = {"zero_ms": mine, "best_peer": best, "best_peer_ms": theirs,
                           "ratio": engine, "ratio_refused": engine_why,
                           "zero_step_ms": r["ms_step"], "best_peer_step_ms": by_peer[best]["ms_step"],
                           "step_ratio": step, "step_ratio_refused": step_why}
    return out


def ratio_lines(ratios):
    """One line per zero stage: the whole-step ratio, then the engine-share ratio or why none."""
    lines = []
    for stage, v in sorted(ratios.items()):
        best = v["best_peer"]
        if v["step_ratio"] is not None:
            step = (f"step {v['zero_step_ms']:.1f} ms = {v['step_ratio']:.2f}x the best peer's step "
                    f"({best}, {v['best_peer_step_ms']:.1f} ms)")
        else:
            step = f"step: no ratio, {v['step_ratio_refused']}"
        if v["zero_ms"] is None or v["best_peer_ms"] is None:
            engine = "engine share: none without a bare run"
        elif v["ratio"] is not None:
            engine = (f"engine share (step - bare) {v['zero_ms']:.1f} ms = {v['ratio']:.2f}x the best peer's "
                      f"({best}, {v['best_peer_ms']:.1f} ms)")
        else:
            engine = (f"engine share (step - bare) {v['zero_ms']:.1f} ms against {best}'s {v['best_peer_ms']:.1f} ms: "
                      f"no ratio, {v['ratio_refused']}")
        lines.append(f"zero stage {stage}: {step}; {engine}")
    return lines


def zero_bench_path(args):
    """The zero-bench to take the traffic probe from: --zero-bench, else the repository's build."""
    path = args.zero_bench or os.path.join(common.REPO, "build", "benchmarks", "zero-bench")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def optimizer_limits(args, stages):
    """{stage: {...}}: the least time the optimizer's own traffic takes on one rank, from
    zero-bench's traffic probe run on as many processes at once as the ranks (they share the
    memory bus as the ranks do): AdamW over the rank's partition (the whole model at stage 0, a
    1/N share at stages 1-3), its bytes per parameter from zero-bench (fp32: gradient, master
    and two states; bf16: a bf16 gradient and a bf16 model copy written besides). None without
    zero-bench."""
    bench = zero_bench_path(args)
    if bench is None:
        print("torch_peers: no zero-bench (build it, or pass --zero-bench): no optimizer limit",
              file=sys.stderr)
        return None
    numel = sum(p.numel() for p in MODELS[args.model]().parameters())
    grad, out = ("bf16", "bf16") if args.dtype == "bf16" else ("fp32", "none")
    limits = {}
    for stage in stages:
        part = numel if stage == 0 else -(-numel // args.nproc)
        cmd = [bench, "kernels", "--json", "--params", str(part), "--threads", "1", "--reps", "7",
               "--optimizer", "adamw", "--grad-dtype", grad, "--state-dtype", "fp32"]

        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=common.one_thread_env())
                 for _ in range(args.nproc)]
        records = []
        for proc in procs:
            text, _ = proc.communicate(timeout=args.timeout)
            if proc.returncode != 0:
                raise SystemExit(f"torch_peers: {' '.join(cmd)} failed (exit {proc.returncode})")
            records += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        mine = [r for r in records if r["param_out"] == out]
        if len(mine) != args.nproc:
            raise SystemExit(f"torch_peers: zero-bench gave {len(mine)} records for AdamW "
                             f"{grad}/fp32 out {out}, expected {args.nproc}")
        # The slowest process's probe: every rank has to finish its step.
        gb_per_s = min(r["limit_gb_per_s"] for r in mine)
        limits[stage] = {"partition_params": part, "bytes_per_param": mine[0]["bytes_per_param"],
                         "probe_gb_per_s": gb_per_s,
                         "limit_ms": part * mine[0]["bytes_per_param"] / (gb_per_s * 1e9) * 1e3}
    return limits


def limit_lines(rows, limits):
    """One line per zero stage: the time outside forward and backward against the optimizer's
    traffic limit for the rank's partition."""
    lines = []
    for r in rows:
        kind, _, stage = r["peer"].partition("-s")
        if kind != "zero" or limits is None or int(stage) not in limits:
            continue
        lim = limits[int(stage)]
        lines.append(f"zero stage {stage}: outside fwd+bwd {r['ms_outside']:.1f} ms = "
                     f"{r['ms_outside'] / lim['limit_ms']:.2f}x the optimizer's traffic limit "
                     f"({lim['partition_params'] / 1e6:.2f}M params x {lim['bytes_per_param']} B at "
                     f"{lim['probe_gb_per_s']:.1f} GB/s = {lim['limit_ms']:.1f} ms)")
    return lines


def profile_lines(rows):
    """zero's engine.timings() per step, one column per stage: where the engine's time went."""
    profiled = [r for r in rows if "profile" in r]
    if not profiled:
        return []
    keys = [k for k in profiled[0]["profile"] if any(r["profile"].get(k) for r in profiled)]
    headers = ["engine.timings() per step", *(r["peer"] for r in profiled)]
    table = [[k, *(f"{r['profile'].get(k, 0):.2f}" for r in profiled)] for k in keys]
    return ["", *common.markdown_table(headers, table)]


def markdown(rows, args):
    kinds = {"zero": "zero", "deepspeed": "DeepSpeed", "ddp": "PyTorch DDP (gloo)", "fsdp2": "PyTorch FSDP2 (gloo)",
             "bare": "bare forward+backward"}
    table = []
    for r in rows:
        kind, _, stage = r["peer"].partition("-s")
        stage = stage or {"ddp": "(0)", "fsdp2": "(3)", "bare": ""}[kind]
        engine = f"{r['ms_engine']:.1f}" if "ms_engine" in r else ""
        engine_cpu = f"{r['cpu_ms_engine']:.1f}" if "cpu_ms_engine" in r else ""
        loss = "" if kind == "bare" else f"{r['last_loss']:.6f}"
        table.append([kinds[kind], stage, *(f"{r[key]:.1f}" for key in TIMES), engine, engine_cpu,
                      f"{r['peak_rss_mib']:.0f}", loss])
    headers = ["peer", "ZeRO stage", "ms/step", "forward ms", "backward ms", "outside fwd+bwd ms",
               "CPU ms/step", "engine ms (step - bare)", "engine CPU ms", "peak RSS MiB/process",
               "last loss"]
    numel = sum(p.numel() for p in MODELS[args.model]().parameters())
    lines = [f"{args.model} ({numel / 1e6:.1f}M parameters, {args.dtype}), {args.nproc} processes, "
             f"{args.steps} steps after {args.warmup} warm-up, median of {args.repeats} alternating "
             f"repeats (torch {torch.__version__}, CPU)", "",
             *common.markdown_table(headers, table, left=2)]
    ratios = engine_ratios(rows)
    if ratios:
        lines += ["", *ratio_lines(ratios)]
    bare = next((r for r in rows if r["peer"] == "bare"), None)
    if bare is not None:
        lines += [""] + [f"{r['peer']}: backward {r['ms_backward']:.1f} ms = "
                         f"{r['ms_backward'] / bare['ms_backward']:.3f}x the bare run's"
                         for r in rows if r["peer"].startswith("zero")]
    limit = limit_lines(rows, args.limits)
    if limit:
        lines += ["", *limit]
    return "\n".join(lines + profile_lines(rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                   help="bf16: zero and DeepSpeed with their bf16 config, DDP and FSDP2 in mixed precision")
    p.add_argument("--zero-bench", help="zero-bench for the optimizer's traffic limit (default: build/)")
    common.run_flags(p, repeats=3, timeout=600, peers="zero,ddp,fsdp2,deepspeed,bare",
                     stages_help="ZeRO stages for zero (and DeepSpeed)")
    args = p.parse_args()
    if args.worker:
        return worker(args)

    wanted = args.peers.split(",")
    stages = [int(s) for s in args.stages.split(",") if s]
    available = {k: k in wanted for k in ("ddp", "fsdp2")}
    for kind in ("zero", "deepspeed"):
        available[kind] = kind in wanted and common.importable(kind)
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
    args.limits = optimizer_limits(args, [s for s in stages]) if available["zero"] and stages else None
    losses = [r["last_loss"] for r in rows if r["peer"] != "bare"]
    spread = (max(losses) - min(losses)) / max(abs(min(losses)), 1e-12)
    print(markdown(rows, args))
    allowed = LOSS_SPREAD[args.dtype]
    if spread > allowed:
        print(f"\nWARNING: the peers' last losses differ by {spread:.2%}: they did not train the same model",
              file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "nproc": args.nproc, "steps": args.steps, "warmup": args.warmup,
                       "repeats": args.repeats, "torch": torch.__version__, "summary": rows, "runs": runs,
                       "dtype": args.dtype, "optimizer_limits": args.limits,
                       "engine_ratios": {str(k): v for k, v in engine_ratios(rows).items()},
                       "last_loss_spread": spread}, f, indent=1)
    return 1 if spread > allowed else 0


if __name__ == "__main__":
    sys.exit(main())
