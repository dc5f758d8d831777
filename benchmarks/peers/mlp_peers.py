#!/usr/bin/env python3
"""zero-train next to PyTorch DDP, PyTorch FSDP2 and DeepSpeed on zero-train's own job: the
teacher-student MLP, N processes (or ranks) of one thread each, ZeRO stages 0-3, fp32 and bf16.

  .venv/bin/python benchmarks/peers/mlp_peers.py [--nproc 2] [--widths 1024,2048,2048,2048,1024]
      [--micro-batch 16] [--steps 20] [--warmup 3] [--repeats 4] [--stages 0,1,2,3]
      [--precisions fp32,bf16] [--peers zero,zero-mpi,ddp,fsdp2,deepspeed] [--zero-train PATH]
      [--json FILE] [--timeout 900] [--keep-going]

Scaling: run it again with --nproc 4, or with wider --widths (2048,4096,4096,4096,2048 holds 4x
the parameters); every peer builds the model from --widths.

The job, alike in every peer: an MLP of the given widths, ReLU between layers (none after the
last), weights and biases uniform in +-1/sqrt(fan_in); a fixed random teacher MLP of the same
shape; each step each rank draws its micro-batch of inputs from N(0,1) and computes the targets
with the teacher in fp32 (this batch-making is timed as part of the step, as it is in
zero-train's); loss = mean over rows and outputs of (y - target)^2 / 2; AdamW (lr 1e-3, betas
0.9/0.999, eps 1e-8, weight decay 0.01), no clipping, no gradient accumulation.

The peers:
  zero       build/tools/zero-train --world-size N --threads 1 --json: N ranks as threads of one
             process, configured by the ds_config below.
  zero-mpi   the same under `mpirun -np N --bind-to none ... --comm mpi` (left out without mpirun).
  ddp        (stage-0 rows) DistributedDataParallel over gloo, torch.optim.AdamW; bf16 =
             torch.autocast("cpu", bfloat16) around forward and loss, fp32 parameters.
  fsdp2      (stage-3 rows) fully_shard on every Linear, then on the root, gloo, torch AdamW;
             bf16 = MixedPrecisionPolicy(param_dtype=bfloat16).
  deepspeed  (every stage) deepspeed.initialize with the same ds_config as zero-train's, on its
             CPU accelerator over gloo, with its default optimizer: FusedAdam, DeepSpeed's fused
             CPU Adam kernel, compiled on first use (if that build fails: "torch_adam": true; the
             output says which ran). Left out when deepspeed does not import.
  ds_config: {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
  "gradient_clipping": 0.0, "optimizer": {"type": "AdamW", ...}, "zero_optimization": {"stage": S}}
  plus "bf16": {"enabled": true} for bf16.
The Python peers run under `python -m torch.distributed.run`, one thread per process
(torch.set_num_threads(1), OMP_NUM_THREADS=1), and seed the model the same way, so their last
losses can be set side by side (zero-train draws its own weights and data: its loss is shown,
not compared).

What is measured. Every run times each step; after the warm-up the run's figure is the median
step (for the Python peers the slowest rank's median). Every repeat runs every run once, in
order, every other repeat reversed (A B C, C B A, ...), so a machine busy with something else
slows all alike and no run always follows the same one, and every
figure below is the median over repeats.
  ms/step     batch-making + forward + backward + optimizer step.
  fwd+bwd     zero: zero-train's own model_time_s (teacher targets, forward and backward, not
              the hand-over of gradients to the engine). Python peers: the step of a *bare* run
              launched the same way (N processes at once, same batch-making, forward and
              backward; no wrapper, no optimizer, no process group): bare-fp32 (fp32 model),
              bare-bf16 (model in bfloat16: DeepSpeed bf16, FSDP2 bf16), bare-autocast (fp32
              model under autocast: DDP bf16).
  engine      ms/step - fwd+bwd: the optimizer step and the communication the peer does not hide.
  peak RSS    per process: the Python workers' getrusage(RUSAGE_SELF).ru_maxrss; zero (one
              process) from wait4 on it; zero-mpi from wait4 on mpirun, which is the largest of
              mpirun and its ranks. Total = sum over processes (zero-mpi: N x that largest).
For zero and zero-mpi the harness prints ratios: step / DeepSpeed's step, step / DDP's step
(stage 0), engine / the best (smallest) peer engine among DDP, FSDP2 and DeepSpeed at the same
stage and precision, total RSS / DeepSpeed's total.

Output: markdown tables on stdout, progress on stderr, every run, the summary and the settings
in --json FILE. A failed run names itself and shows the tail of its output; the harness then
exits 1, or with --keep-going records the failure, goes on, prints what it has and exits 1 at
the end.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

NAME = "mlp_peers"
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
PYTHON_PEERS = ("ddp", "fsdp2", "deepspeed")
BARE = ("bare-fp32", "bare-bf16", "bare-autocast")
# The Python peers seed and feed the same model: fp32 last losses agree but for summation order.
LOSS_SPREAD = 1e-4


def ds_config(stage, precision, micro_batch, torch_adam=False):
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": dict(ADAMW)},
              "zero_optimization": {"stage": stage}}
    if torch_adam:
        config["optimizer"]["params"]["torch_adam"] = True
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def bare_for(peer, precision):
    """The bare run whose step is this Python peer's forward+backward alone."""
    if precision == "fp32":
        return "bare-fp32"
    return "bare-autocast" if peer == "ddp" else "bare-bf16"


# --- one rank of a Python peer (under torch.distributed.run) -----------------------------------

def mlp(widths):
    import torch

    layers = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [torch.nn.ReLU()] if layers else []
        layers.append(torch.nn.Linear(fan_in, fan_out))  # default init: U(+-1/sqrt(fan_in))
    return torch.nn.Sequential(*layers)


def setup(kind, stage, precision, student, args):
    """Returns (forward(x, target) -> loss, backward(loss), step or None, info) for one peer."""
    import torch

    bf16 = torch.bfloat16
    half = precision == "bf16"
    info = {}
    in_dtype, autocast = torch.float32, (kind == "ddp" and half) or kind == "bare-autocast"
    step = None
    if kind == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        model, *_ = deepspeed.initialize(model=student, model_parameters=student.parameters(),
                                         config=ds_config(stage, precision, args.micro_batch,
                                                          torch_adam=args.ds_adam == "torch_adam"))
        info = {"optimizer": type(model.basic_optimizer).__name__, "wrapper": type(model.optimizer).__name__}
        in_dtype = bf16 if half else torch.float32
        backward, step = model.backward, model.step
    elif kind.startswith("bare"):
        model = student.to(bf16) if kind == "bare-bf16" else student
        in_dtype = bf16 if kind == "bare-bf16" else torch.float32
        backward = torch.Tensor.backward
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(student)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=bf16) if half else MixedPrecisionPolicy()
            for layer in student:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mp_policy=policy)
            model = fully_shard(student, mp_policy=policy)
        opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                                weight_decay=ADAMW["weight_decay"])
        info = {"optimizer": type(opt).__name__}
        backward = torch.Tensor.backward

        def step():
            opt.step()
            opt.zero_grad(set_to_none=True)

    def forward(x, target):
        with torch.autocast("cpu", dtype=bf16, enabled=autocast):
            y = model(x.to(in_dtype))
            return ((y.float() - target) ** 2).mean() / 2

    return forward, backward, step, info


def worker(args):
    import torch

    rank, world = common.worker_rank()
    widths = [int(w) for w in args.widths.split(",")]
    torch.manual_seed(0)
    student, teacher = mlp(widths), mlp(widths).requires_grad_(False)
    forward, backward, step, info = setup(args.worker, args.stage, args.precision, student, args)
    g = torch.Generator().manual_seed(1000 + rank)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.micro_batch, widths[0], generator=g)
        with torch.no_grad():
            target = teacher(x)
        loss = forward(x, target)
        backward(loss)
        t1 = time.perf_counter()
        if step:
            step()
        t2 = time.perf_counter()
        if not step:
            student.zero_grad(set_to_none=True)  # a bare run: untimed, so each backward starts afresh
        if i >= args.warmup:
            times.append((t2 - t0, t1 - t0, t2 - t1))
    med = [statistics.median(t[j] for t in times) * 1e3 for j in range(3)]
    common.write_rank(args.out, rank, dict(info, rank=rank, world=world, ms_step=med[0], ms_batch_fwd_bwd=med[1],
                                           ms_opt=med[2], peak_rss_mib=common.peak_rss_mib(),
                                           last_loss=loss.item()))
    common.exit_worker()


# --- the driver: one run -----------------------------------------------------------------------

def run_python(args, spec, workdir, index):
    peer, stage, precision = spec
    out = os.path.join(workdir, f"{peer}-s{stage}-{precision}.{index}")
    cmd = ["--worker", peer, "--widths", args.widths, "--micro-batch", str(args.micro_batch), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--out", out]
    if peer == "deepspeed":
        cmd += ["--ds-adam", args.ds_adam]
    if stage is not None:
        cmd += ["--stage", str(stage), "--precision", precision]
    common.torchrun(__file__, args.nproc, cmd, label(spec), args.timeout,
                    env=common.one_thread_env(DS_ACCELERATOR="cpu"))
    run, ranks = common.read_ranks(out, args.nproc, ("ms_step", "ms_batch_fwd_bwd", "ms_opt"))
    rss = run.pop("peak_rss_mib")
    return dict(run, peak_rss_mib=max(rss), processes=args.nproc, peak_rss_mib_total=sum(rss),
                peak_rss_mib_ranks=rss, **{k: ranks[0][k] for k in ("optimizer", "wrapper") if k in ranks[0]})


def run_zero(args, spec, workdir):
    peer, stage, precision = spec
    config = os.path.join(workdir, f"ds_config_s{stage}_{precision}.json")
    with open(config, "w") as f:
        json.dump(ds_config(stage, precision, args.micro_batch), f)
    cmd = [args.zero_train, "--config", config, "--world-size", args.nproc, "--threads", 1,
           "--model", f"mlp:{args.widths}", "--steps", args.warmup + args.steps, "--json"]
    if peer == "zero-mpi":
        cmd = [args.mpirun, *mpirun_flags(args.nproc), "-np", args.nproc, cmd[0], "--comm", "mpi", *cmd[1:]]
    text, usage = common.run_child(cmd, label(spec), env=common.one_thread_env(), timeout=args.timeout)
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    steps = [o for o in lines if "step_time_s" in o and o["step"] > args.warmup]
    summary = [o for o in lines if o.get("summary")]
    if not steps or not summary:
        raise common.RunFailed(label(spec), "no per-step JSON or no summary in its output", text)
    rss = usage.ru_maxrss / 1024
    processes = args.nproc if peer == "zero-mpi" else 1
    return {"ms_step": statistics.median(o["step_time_s"] for o in steps) * 1e3,
            "ms_fwd_bwd": statistics.median(o["model_time_s"] for o in steps) * 1e3,
            "peak_rss_mib": rss, "processes": processes, "peak_rss_mib_total": rss * processes,
            "last_loss": summary[-1]["final_loss"]}


def mpirun_flags(nproc):
    # As tests/tools run it: as root OpenMPI wants to be told; more ranks than cores, too.
    return (["--bind-to", "none"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
            + (["--oversubscribe"] if nproc > os.cpu_count() else []))


def label(spec):
    peer, stage, precision = spec
    return peer if stage is None else f"{peer} s{stage} {precision}"


def fused_adam_builds(args):
    """Whether DeepSpeed's fused CPU Adam compiles and loads here. DeepSpeed compiles its CPU ops
    on first use: built here once, they are not compiled by N ranks at once inside a run."""
    print(f"{NAME}: loading DeepSpeed's CPU ops (compiled on first use, then cached)", file=sys.stderr)
    for op in ("ShareMemCommBuilder", "FusedAdamBuilder"):  # the first: deepspeed.init_distributed's
        probe = f"from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder({op!r}).load()"
        try:
            common.run_child([sys.executable, "-c", probe], op, env=common.one_thread_env(DS_ACCELERATOR="cpu"),
                             timeout=args.timeout, cwd="/")
        except common.RunFailed as e:
            print(f"{NAME}: DeepSpeed's {op} does not build ({e.status}):\n{e.tail()}", file=sys.stderr)
            if op == "FusedAdamBuilder":
                print(f"{NAME}: DeepSpeed runs with \"torch_adam\": true", file=sys.stderr)
                return False
    return True


# --- the driver: which runs, and the summary ---------------------------------------------------

def plan(args):
    """(runs in the order of one repeat, the messages of peers left out)."""
    wanted = [p for p in args.peers.split(",") if p]
    unknown = set(wanted) - {"zero", "zero-mpi", *PYTHON_PEERS}
    if unknown:
        raise SystemExit(f"{NAME}: unknown peer(s) {', '.join(sorted(unknown))}")
    left_out = []

    def leave_out(peers, why):
        for peer in [p for p in peers if p in wanted]:
            wanted.remove(peer)
            left_out.append(f"{peer}: {why}")

    if not os.access(args.zero_train, os.X_OK):
        leave_out(["zero", "zero-mpi"], f"{args.zero_train} is not an executable (build it, or pass --zero-train)")
    args.mpirun = shutil.which("mpirun")
    if args.mpirun:
        # Found as /bin/mpirun (a link to /usr/bin), OpenMPI takes "/" for its prefix and refuses.
        args.mpirun = os.path.join(os.path.realpath(os.path.dirname(args.mpirun)), os.path.basename(args.mpirun))
    else:
        leave_out(["zero-mpi"], "no mpirun on PATH")
    if importlib.util.find_spec("torch") is None:
        leave_out(PYTHON_PEERS, f"torch does not import with {sys.executable}")
    if "deepspeed" in wanted and not common.importable("deepspeed"):
        leave_out(["deepspeed"], f"deepspeed does not import with {sys.executable}")
    args.ds_adam = None if "deepspeed" not in wanted else "fused" if fused_adam_builds(args) else "torch_adam"
    for message in left_out:
        print(f"{NAME}: {message}: left out", file=sys.stderr)

    specs = []
    for precision in args.precisions.split(","):
        for stage in (int(s) for s in args.stages.split(",") if s):
            row = ["zero", "zero-mpi"] + (["ddp"] if stage == 0 else []) + (["fsdp2"] if stage == 3 else []) + ["deepspeed"]
            specs += [(peer, stage, precision) for peer in row if peer in wanted]
    bare = {bare_for(peer, precision) for peer, _, precision in specs if peer in PYTHON_PEERS}
    specs += [(b, None, None) for b in BARE if b in bare]
    if not specs:
        raise SystemExit(f"{NAME}: no peer to run")
    return specs, left_out


def summarise(runs, specs):
    rows = []
    for spec in specs:
        mine = [r for r in runs if r["label"] == label(spec) and not r.get("failed")]
        peer, stage, precision = spec
        row = {"peer": peer, "stage": stage, "precision": precision, "repeats": len(mine)}
        if mine:
            for key in ("ms_step", "peak_rss_mib", "peak_rss_mib_total"):
                row[key] = common.median_of(mine, key)
            row.update(processes=mine[0]["processes"], last_loss=mine[-1]["last_loss"])
            if peer.startswith("zero"):
                row["ms_fwd_bwd"] = common.median_of(mine, "ms_fwd_bwd")
            row.update({k: mine[0][k] for k in ("optimizer", "wrapper") if k in mine[0]})
        rows.append(row)
    bare = {r["peer"]: r.get("ms_step") for r in rows if r["stage"] is None}
    for row in rows:
        if row["peer"] in PYTHON_PEERS:
            row["fwd_bwd_from"] = bare_for(row["peer"], row["precision"])
            row["ms_fwd_bwd"] = bare.get(row["fwd_bwd_from"])
        if row["stage"] is not None and row.get("ms_step") is not None and row.get("ms_fwd_bwd") is not None:
            row["ms_engine"] = row["ms_step"] - row["ms_fwd_bwd"]
    return rows


def ratio(a, b):
    return a / b if a is not None and b else None


def compare(rows):
    """zero's and zero-mpi's ratios to the peers at each stage and precision."""
    found = {(r["peer"], r["stage"], r["precision"]): r for r in rows}
    out = []
    for row in rows:
        if not row["peer"].startswith("zero") or row.get("ms_step") is None:
            continue
        at = row["stage"], row["precision"]
        ds, ddp = found.get(("deepspeed", *at), {}), found.get(("ddp", *at), {})
        engines = [(found[(p, *at)]["ms_engine"], p) for p in PYTHON_PEERS if found.get((p, *at), {}).get("ms_engine") is not None]
        best = min(engines) if engines else (None, None)
        out.append({"peer": row["peer"], "stage": row["stage"], "precision": row["precision"],
                    "step_vs_deepspeed": ratio(row["ms_step"], ds.get("ms_step")),
                    "step_vs_ddp": ratio(row["ms_step"], ddp.get("ms_step")),
                    "engine_vs_best_peer": ratio(row.get("ms_engine"), best[0]) if (best[0] or 0) > 0 else None,
                    "best_peer": best[1], "best_peer_engine_ms": best[0],
                    "rss_total_vs_deepspeed": ratio(row["peak_rss_mib_total"], ds.get("peak_rss_mib_total"))})
    return out


def loss_spreads(rows):
    """Per precision: the Python peers' last losses (lowest, highest, relative spread)."""
    spreads = {}
    for precision in sorted({r["precision"] for r in rows if r["precision"]}):
        losses = [r["last_loss"] for r in rows if r["peer"] in PYTHON_PEERS and r["precision"] == precision
                  and r.get("last_loss") is not None]
        if len(losses) > 1:
            spreads[precision] = (min(losses), max(losses), (max(losses) - min(losses)) / max(abs(min(losses)), 1e-12))
    return spreads


def fmt(value, spec=".1f", suffix=""):
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(args, header, rows, ratios, spreads, left_out):
    table = [[r["stage"], r["precision"], r["peer"], fmt(r.get("ms_step")), fmt(r.get("ms_fwd_bwd")),
              fmt(r.get("ms_engine")), fmt(r.get("peak_rss_mib"), ".0f"), r.get("processes", "-"),
              fmt(r.get("peak_rss_mib_total"), ".0f"), fmt(r.get("last_loss"), ".6g")]
             for r in rows if r["stage"] is not None]
    lines = [header, "", *common.markdown_table(
        ["stage", "precision", "peer", "ms/step", "fwd+bwd ms", "engine ms", "peak RSS MiB/process", "processes",
         "total RSS MiB", "last loss"], table, left=3)]
    if ratios:
        table = [[r["stage"], r["precision"], r["peer"], fmt(r["step_vs_deepspeed"], ".2f", "×"),
                  fmt(r["step_vs_ddp"], ".2f", "×"),
                  fmt(r["engine_vs_best_peer"], ".2f", f"× ({r['best_peer']})"),
                  fmt(r["rss_total_vs_deepspeed"], ".2f", "×")] for r in ratios]
        lines += ["", *common.markdown_table(
            ["stage", "precision", "zero run", "step / DeepSpeed step", "step / DDP step",
             "engine / best peer engine", "total RSS / DeepSpeed total"], table, left=3)]
    bare = [f"{r['peer']} {fmt(r.get('ms_step'))} ms/step, {fmt(r.get('peak_rss_mib'), '.0f')} MiB/process"
            for r in rows if r["stage"] is None]
    notes = [
        "fwd+bwd: zero and zero-mpi = zero-train's own model_time_s (rank 0: teacher targets, forward, backward, "
        "without the hand-over of gradients to the engine); Python peers = the step of a bare run (N processes at "
        "once, same batch-making, forward and backward; no wrapper, optimizer or process group): bare-fp32 for "
        "fp32, bare-bf16 for DeepSpeed and FSDP2 bf16, bare-autocast for DDP bf16. engine = ms/step - fwd+bwd.",
        "peak RSS: Python peers = each worker's getrusage; zero = wait4 on its one process (N ranks as threads); "
        "zero-mpi = wait4 on mpirun (the largest of mpirun and its ranks), total = N × that.",
        "last loss: mean over ranks of the last step's loss; the Python peers share weights and data, "
        "zero-train draws its own (not comparable).",
    ]
    if bare:
        notes.append("bare runs: " + "; ".join(bare) + ".")
    for precision, (low, high, spread) in spreads.items():
        notes.append(f"Python peers' last losses, {precision}: {low:.6g} to {high:.6g} (relative spread {spread:.1e}).")
    if "deepspeed" in {r["peer"] for r in rows}:
        ran = sorted({f"{r['optimizer']} in {r['wrapper']}" for r in rows if r["peer"] == "deepspeed" and r.get("optimizer")})
        notes.append(f"DeepSpeed's optimizer: {'fused CPU Adam (FusedAdam, JIT-built)' if args.ds_adam == 'fused' else 'torch AdamW (torch_adam: the fused CPU Adam did not build)'}"
                     + (f"; ran: {', '.join(ran)}." if ran else "."))
    failed = [r for r in rows if r.get("ms_step") is None]
    notes += [f"left out: {m}." for m in left_out] + [f"failed in every repeat: {label((r['peer'], r['stage'], r['precision']))}." for r in failed]
    return "\n".join(lines + ["", *(f"- {n}" for n in notes)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.run_flags(p, repeats=4, timeout=900, peers="zero,zero-mpi,ddp,fsdp2,deepspeed",
                     stages_help="ZeRO stages (DDP runs in the stage-0 rows, FSDP2 in the stage-3 rows)")
    p.add_argument("--zero-train", default=str(common.REPO / "build" / "tools" / "zero-train"), help="the binary")
    p.add_argument("--widths", default="1024,2048,2048,2048,1024", help="the MLP's layer widths IN,H1,...,OUT")
    p.add_argument("--micro-batch", type=int, default=16, help="rows per process per step")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--keep-going", action="store_true", help="record a failed run and go on (exit 1 at the end)")
    p.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    p.add_argument("--precision", help=argparse.SUPPRESS)
    p.add_argument("--ds-adam", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    widths = [int(w) for w in args.widths.split(",")]
    if len(widths) < 2 or min(widths) < 1:
        raise SystemExit(f"{NAME}: --widths needs at least two positive widths")
    args.precisions = ",".join(x for x in args.precisions.split(",") if x)
    if set(args.precisions.split(",")) - {"fp32", "bf16"}:
        raise SystemExit(f"{NAME}: --precisions takes fp32 and bf16")
    specs, left_out = plan(args)
    versions = {}
    for package in ("torch", "deepspeed"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    params = sum(a * b + b for a, b in zip(widths, widths[1:]))
    cpus = os.cpu_count()
    oversubscribed = args.nproc > cpus
    adam = ""
    if args.ds_adam:
        adam = " (" + {"fused": "its fused CPU Adam", "torch_adam": "torch_adam"}[args.ds_adam] + ")"
    header = (f"MLP {args.widths} ({params:,} parameters), micro-batch {args.micro_batch} per process, "
              f"{args.nproc} processes × 1 thread, {args.steps} steps after {args.warmup} warm-up, median of "
              f"{args.repeats} alternating repeats; torch {versions['torch']}, deepspeed {versions['deepspeed']}"
              f"{adam}; {cpus} CPUs: {'oversubscribed' if oversubscribed else 'not oversubscribed'}")

    def run_one(spec, workdir, index):
        run = run_zero(args, spec, workdir) if spec[0].startswith("zero") else run_python(args, spec, workdir, index)
        return dict(run, peer=spec[0], stage=spec[1], precision=spec[2])

    by_label = {label(s): s for s in specs}
    with tempfile.TemporaryDirectory(prefix="mlp_peers.") as workdir:
        runs = common.alternate(NAME, args.repeats, list(by_label), lambda name, index: run_one(by_label[name], workdir, index),
                                keep_going=args.keep_going)
    rows = summarise(runs, specs)
    ratios = compare(rows)
    spreads = loss_spreads(rows)
    print(markdown(args, header, rows, ratios, spreads, left_out))
    if spreads.get("fp32", (0, 0, 0))[2] > LOSS_SPREAD:
        print(f"{NAME}: WARNING: the Python peers' fp32 last losses differ by {spreads['fp32'][2]:.2%}: "
              "they did not train the same model", file=sys.stderr)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("worker", "out", "stage", "precision")}
        with open(args.json, "w") as f:
            json.dump({"settings": dict(settings, params=params, cpus=cpus, oversubscribed=oversubscribed,
                                        versions=versions, left_out=left_out),
                       "header": header, "runs": runs, "summary": rows, "ratios": ratios,
                       "last_loss_spreads": spreads}, f, indent=1)
    return 1 if any(r.get("failed") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
