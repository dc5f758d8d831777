#!/usr/bin/env python3
"""zero.initialize on one GPU against plain PyTorch on the same GPU (issue 31 item 5, its speed):
the same GPT-style transformer, data and AdamW, one process, peers one after another, each on a
freshly built model.

Peers:
  torch   torch.optim.AdamW(fused=True) with zero_grad(set_to_none=True); bf16: the model stays
          fp32 and computes under torch.autocast (PyTorch's own mixed precision)
  zero-sS zero.initialize at ZeRO stage S (0-3); bf16: zero's bf16 config (a bf16 model, fp32
          master weights and states in the engine)
  zero-s3-hostwait  stage 3 with every gather waited for by the host (ZERO_GATHER_ON_STREAM=0)
          instead of by torch's stream on the GPU: the comparison for zero-s3 (with stage 3)
  bare    forward and backward only (bf16: on a bf16 model), gradients dropped: the floor every
          peer's step sits on
Per peer: ms per step (the median over --steps timed steps after --warmup; with --repeats R, the
peers run R rounds in turn, every other round in reverse order, and each peer's figures are those
of its median round), its forward,
backward
and outside (the optimizer step and whatever else the peer does after backward) ms, each phase
timed between device synchronizations; the engine share (ms per step minus the bare run's); the
GPU memory the process peaked at (torch.cuda.max_memory_allocated, plus the engine's device peak
from engine.memory() for zero, whose model states are its own allocations); the last loss, which
every fp32 peer must reach within 1e-4 of torch's (bf16: 3e-2). For each zero stage the whole step
and the engine share against torch's; a share whose baseline is not positive is refused, with the
reason, rather than printed as a ratio.

  python3 benchmarks/peers/cuda_train_peers.py [--model gpt-110m|transformer] [--dtype bf16|fp32]
      [--stages 0,1,2,3] [--steps 10] [--warmup 3] [--repeats 1] [--device cuda|cpu]
      [--json out.json] [--profile DIR]

--device cpu runs the same harness on the CPU (with --model transformer, a check of the harness
on a machine without a GPU; not a figure). Exit status: 0 every peer ran and the losses agree;
1 a peer failed or a loss disagrees (the rest is still printed and written); 2 no CUDA GPU (or no
torch, or zero does not import).
"""
import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DATA_SEED, MODEL_SEED = 1, 0


def models():
    import torch_peers

    class Gpt110M(torch_peers.Transformer):
        # ~110M parameters with the tied head: GPT-2 small's width and depth, a 32K vocabulary.
        VOCAB, SEQ, D, HEADS, LAYERS, BATCH = 32768, 512, 768, 12, 12, 8

    return {"gpt-110m": Gpt110M, "transformer": torch_peers.Transformer}


def run_peer(peer, cls, args, profile=False):
    """Trains one peer; returns its figures (and profiles it when `profile`)."""
    import torch
    from torch_peers import BETAS, EPS, LR, WEIGHT_DECAY, zero_config

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bf16 = args.dtype == "bf16"
    torch.manual_seed(MODEL_SEED)
    model = cls().to(device)
    engine = None
    autocast = None
    if peer == "bare":
        if bf16:
            model.to(torch.bfloat16)
        forward, backward = model, lambda loss: loss.backward()

        def step():
            for p in model.parameters():
                p.grad = None
    elif peer == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY, fused=device.type == "cuda")
        if bf16:
            autocast = torch.autocast(device.type, dtype=torch.bfloat16)
        forward, backward = model, lambda loss: loss.backward()

        def step():
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        import zero

        stage = int(peer.removeprefix("zero-s").removesuffix("-hostwait"))
        host_wait = peer.endswith("-hostwait")
        if host_wait:
            os.environ["ZERO_GATHER_ON_STREAM"] = "0"  # read once, by the engine's construction
        try:
            engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(),
                                         config=zero_config(stage, cls.BATCH, args.dtype))
        finally:
            if host_wait:
                del os.environ["ZERO_GATHER_ON_STREAM"]
        forward, backward, step = engine, engine.backward, engine.step
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    g = torch.Generator().manual_seed(DATA_SEED)
    def one_step():
        """(step, forward, backward, outside) seconds and the loss of one training step."""
        x, y = (t.to(device) for t in cls.batch(g))
        sync()
        t0 = time.perf_counter()
        if autocast is not None:
            with autocast:
                out = forward(x)
        else:
            out = forward(x)
        loss = cls.loss(out, y)
        sync()
        t1 = time.perf_counter()
        backward(loss)
        sync()
        t2 = time.perf_counter()
        step()
        sync()
        t3 = time.perf_counter()
        return (t3 - t0, t1 - t0, t2 - t1, t3 - t2), loss

    times, loss = [], None
    for i in range(args.warmup + args.steps):
        t, loss = one_step()
        if i >= args.warmup:
            times.append(t)
    if profile:
        profile_steps(peer, one_step, engine, device, args)
    med = [statistics.median(t[k] for t in times) * 1e3 for k in range(4)]
    result = {"peer": peer, "ms_step": med[0], "ms_forward": med[1], "ms_backward": med[2],
              "ms_outside": med[3], "last_loss": loss.item()}
    if device.type == "cuda":
        result["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
    if engine is not None:
        kinds = engine.memory().get("kinds", {})
        result["engine_device_peak_bytes"] = kinds.get("device", {}).get("peak")
        engine.close()
    del model, engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def profile_steps(peer, one_step, engine, device, args):
    """--profile DIR: two more steps of the peer under torch.profiler, its operators and CUDA
    runtime calls by self CPU time (and CUDA time on a GPU) into DIR/PEER.txt, with the engine's
    timings of those steps for zero's peers. Not counted in the figures."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    if engine is not None:
        engine.timings(reset=True)
    with profile(activities=activities) as prof:
        for _ in range(2):
            one_step()
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    text = [f"{peer}: two steps under torch.profiler, by self CPU time",
            averages.table(sort_by="self_cpu_time_total", row_limit=40)]
    if device.type == "cuda":
        text += ["by self CUDA time", averages.table(sort_by="self_cuda_time_total", row_limit=25)]
    if engine is not None:
        text += ["engine.timings() of the two steps",
                 json.dumps(engine.timings(), indent=1, sort_keys=True, default=str)]
    (out / f"{peer}.txt").write_text("\n".join(text) + "\n")
    trace = out / f"{peer}.trace.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="gpt-110m (default on a GPU) or transformer")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every peer in turn; a peer's figures are its median round's")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--profile", metavar="DIR",
                   help="also profile two steps of every peer (torch.profiler) into DIR/PEER.txt")
    args = p.parse_args()
    if args.repeats < 1 or args.steps < 1:
        p.error(f"--repeats {args.repeats} --steps {args.steps}: both must be at least 1")
    try:
        import torch
    except ImportError:
        print("cuda_train_peers: no torch", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_train_peers: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    try:
        import zero  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure to import is the same answer
        print(f"cuda_train_peers: zero does not import: {e}", file=sys.stderr)
        return 2
    table = models()
    name = args.model or ("gpt-110m" if args.device == "cuda" else "transformer")
    if name not in table:
        p.error(f"--model {name}: expected one of {', '.join(sorted(table))}")
    cls = table[name]
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for every peer
    stages = [int(s) for s in args.stages.split(",") if s != ""]
    peers = ["bare", "torch"] + [f"zero-s{s}" for s in stages]
    if 3 in stages:
        peers.append("zero-s3-hostwait")
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU"
    params = sum(q.numel() for q in cls().parameters())
    print(f"{name} ({params / 1e6:.1f}M parameters, batch {cls.BATCH} x {cls.SEQ} tokens), "
          f"{args.dtype}, on {where}; median of {args.steps} steps after {args.warmup}"
          + (f", median round of {args.repeats}" if args.repeats > 1 else ""), flush=True)
    rounds, failed = {peer: [] for peer in peers}, []
    for rep in range(args.repeats):
        # On the H200 the second of two back-to-back runs was often the faster, whichever it was.
        for peer in common.round_order(peers, rep):
            if peer in failed:
                continue
            try:
                rounds[peer].append(run_peer(peer, cls, args, profile=args.profile and rep == 0))
            except Exception:  # noqa: BLE001 - reported, then the next peer
                failed.append(peer)
                print(f"{peer} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    results = {}
    for peer, runs in rounds.items():
        if peer in failed or not runs:
            continue
        median = sorted(runs, key=lambda r: r["ms_step"])[len(runs) // 2]
        results[peer] = dict(median, ms_step_rounds=[r["ms_step"] for r in runs])
    from torch_peers import LOSS_SPREAD

    bare = results.get("bare", {}).get("ms_step")
    ref = results.get("torch")
    lines = ["| peer | ms/step | forward | backward | outside | engine share | peak GPU MiB | "
             "whole step / torch | share / torch | last loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    mismatched = []
    for peer in peers:
        r = results.get(peer)
        if r is None:
            lines.append(f"| {peer} | failed | | | | | | | | |")
            continue
        share = r["ms_step"] - bare if bare is not None and peer != "bare" else None
        r["engine_share_ms"] = share
        peak = r.get("torch_peak_bytes", 0) + (r.get("engine_device_peak_bytes") or 0)
        r["peak_device_bytes"] = peak if args.device == "cuda" else None
        whole = share_ratio = refused = None
        if ref is not None and peer.startswith("zero"):
            whole = r["ms_step"] / ref["ms_step"]
            share_ratio, refused = common.ratio_or_refusal(
                share, ref["ms_step"] - bare if bare is not None else None, peer, "torch",
                "engine share", " (a noisy bare run)")
            r.update(whole_step_ratio=whole, share_ratio=share_ratio, share_ratio_refused=refused)
            if abs(r["last_loss"] - ref["last_loss"]) > LOSS_SPREAD[args.dtype] * max(
                    1.0, abs(ref["last_loss"])):
                mismatched.append(f"{peer}: last loss {r['last_loss']:.6f}, torch's "
                                  f"{ref['last_loss']:.6f}")

        def cell(v, fmt="{:.2f}"):
            return "" if v is None else fmt.format(v)

        lines.append(f"| {peer} | {r['ms_step']:.2f} | {r['ms_forward']:.2f} | "
                     f"{r['ms_backward']:.2f} | {r['ms_outside']:.2f} | {cell(share)} | "
                     f"{cell(peak / 2**20 if args.device == 'cuda' else None, '{:.0f}')} | "
                     f"{cell(whole, '{:.3f}')} | "
                     f"{cell(share_ratio, '{:.3f}') if refused is None else 'refused'} | "
                     f"{r['last_loss']:.6f} |")
    print("\n".join(lines))
    for m in mismatched:
        print(f"loss mismatch: {m}")
    for r in results.values():
        if r.get("share_ratio_refused"):
            print(r["share_ratio_refused"])
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"model": name, "params": params, "dtype": args.dtype, "device": where,
             "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
             "peers": results, "failed": failed,
             "loss_mismatches": mismatched}, indent=1))
    return 1 if failed or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
