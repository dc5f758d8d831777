#!/usr/bin/env python3
"""zero's CUDA AdamW step against torch.optim.AdamW(fused=True) on the same GPU, in the same run
(issue 31 item 4).

For each --params N (default 64M,1G; K, M, G are binary: 2^26 and 2^30) split into --tensors K
(default 100) tensors of mixed sizes:

  1. zero: `zero-bench kernels --device cuda --optimizer adamw --grad-dtype fp32 --state-dtype fp32
     --params N --tensors K --json`: all K tensors stepped by one multi-tensor call, checked bitwise
     against the CPU kernels, best of --reps, next to the traffic probe (the same kernel and
     launches with one add per array in place of the update: the copy roofline) over the same
     tensors. Its records carry the tensor sizes ("sizes"; the formula is zero-bench's
     tensor_sizes), which step 2 reuses.
  2. torch, once every zero-bench run has exited (the two never hold GPU memory at once): the same
     sizes as fp32 parameters and gradients on the GPU, torch.optim.AdamW(fused=True) with
     zero-bench's hyperparameters (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), each
     step timed with CUDA events from an idle device after --warmup steps, best of --reps (as
     zero-bench times its own). "bf16 params, fp32 master" is the fused step on the fp32 master
     plus torch._foreach_copy_ into a bf16 copy of every parameter, timed together; zero does
     both in its one kernel (its bf16 param_out).
  3. DeepSpeed's FusedAdam (deepspeed.ops.adam.FusedAdam, adam_w_mode) on the same tensors and
     timed the same way, where deepspeed imports (--deepspeed auto, the default): in a process of
     its own under --deepspeed-timeout seconds, since its CUDA extension is compiled at first use
     (TORCH_EXTENSIONS_DIR says where). For context: no target, and its failure only says why.
  4. torch's device-to-device copy of --copy-bytes, for context (GB/s counts the read and the
     write).

Both peers' GB/s count the bytes zero-bench counts: 28 per parameter for fp32 AdamW (reads p, g,
m, v; writes p, m, v), 30 with the bf16 parameter write. speedup = torch time / zero time.
Targets (issue 31): zero/probe >= 0.85 and speedup >= 1.0 in both cases at every N.

  python3 benchmarks/peers/cuda_optimizer_peers.py [--zero-bench build-gpu/benchmarks/zero-bench]
      [--params 64M,1G] [--tensors 100] [--sizes-seed 1] [--reps 20] [--warmup 5]
      [--copy-bytes 1G] [--deepspeed auto|off] [--deepspeed-timeout 150] [--json out.json]

Exit status: 0 every target met; 1 a target missed (the figures are still printed and written);
2 nothing comparable measured: no torch, no CUDA GPU, zero-bench missing or failing.
"""
import argparse
import gc
import json
import os
import statistics
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01  # zero-bench kernels' AdamW
TARGET_PROBE_RATIO = 0.85
TARGET_SPEEDUP = 1.0
# zero-bench's param_out value -> the case's name and the bytes per parameter both peers count.
CASES = {"none": ("fp32", 28), "bf16": ("bf16 params, fp32 master", 30)}


class CannotMeasure(Exception):
    """Nothing comparable can be measured (exit status 2)."""


def count(text):
    """'64M' -> 67108864 (K, M, G binary, as zero-bench's --params), '1000' -> 1000."""
    original = text = text.strip()
    scale = 1
    if text and text[-1].upper() in "KMG":
        scale = 1024 ** ("KMG".index(text[-1].upper()) + 1)
        text = text[:-1]
    try:
        value = float(text) * scale
    except ValueError:
        value = 0
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole count such as 65536 or 64M, got {original!r}")
    return int(value)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zero-bench", type=Path, default=REPO / "build-gpu" / "benchmarks" / "zero-bench",
                   help="the zero-bench executable (default: build-gpu/benchmarks/zero-bench)")
    p.add_argument("--params", type=lambda s: [count(x) for x in s.split(",")], default=[1 << 26, 1 << 30],
                   help="comma-separated parameter counts (default 64M,1G)")
    p.add_argument("--tensors", type=int, default=100, help="tensors the parameters are split into (default 100)")
    p.add_argument("--sizes-seed", type=int, default=1, help="zero-bench's --sizes-seed (default 1)")
    p.add_argument("--reps", type=int, default=20, help="timed steps per peer and case; the best counts (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="torch steps before timing (default 5)")
    p.add_argument("--copy-bytes", type=count, default=1 << 30,
                   help="bytes of torch's device-to-device copy (default 1G)")
    p.add_argument("--deepspeed", choices=("auto", "off"), default="auto",
                   help="time DeepSpeed's FusedAdam too where deepspeed imports (default auto)")
    p.add_argument("--deepspeed-timeout", type=int, default=150,
                   help="seconds for DeepSpeed's peer, its extension's build included (default 150)")
    p.add_argument("--deepspeed-peer", nargs=2, type=Path, metavar=("SIZES_JSON", "OUT_JSON"),
                   help=argparse.SUPPRESS)  # the DeepSpeed peer's own process
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if args.tensors < 1 or args.reps < 1 or args.warmup < 0:
        p.error("--tensors and --reps must be >= 1, --warmup >= 0")
    return args


# --- zero --------------------------------------------------------------------------------------

def run_zero(args, params):
    """zero-bench's records for fp32 grads and states, by param_out ("none", "bf16")."""
    cmd = [str(args.zero_bench), "kernels", "--device", "cuda", "--optimizer", "adamw", "--grad-dtype", "fp32",
           "--state-dtype", "fp32", "--params", str(params), "--tensors", str(args.tensors), "--sizes-seed",
           str(args.sizes_seed), "--reps", str(args.reps), "--json"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise CannotMeasure(f"zero-bench exited {proc.returncode}:\n{tail}")
    records = {}
    for line in proc.stdout.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("bench") == "kernels" and r.get("grad_dtype") == "fp32" and r.get("state_dtype") == "fp32":
            records[r["param_out"]] = r
    for out, (_, bytes_per_param) in CASES.items():
        r = records.get(out)
        if r is None:
            raise CannotMeasure(f"zero-bench printed no record with param_out {out} for {params} params")
        sizes = r.get("sizes", [])
        if r.get("tensors") != args.tensors or len(sizes) != args.tensors or sum(sizes) != params:
            raise CannotMeasure(f"zero-bench's record for {params} params does not carry {args.tensors} "
                                f"sizes summing to it (tensors {r.get('tensors')}, {len(sizes)} sizes)")
        if r["bytes_per_param"] != bytes_per_param:
            raise CannotMeasure(f"zero-bench counts {r['bytes_per_param']} bytes per parameter for param_out "
                                f"{out}; this script expects {bytes_per_param}")
    return records


# --- torch -------------------------------------------------------------------------------------

def time_cuda(torch, fn, warmup, reps):
    """(best, median) seconds of fn on the GPU: from an idle device, between two CUDA events."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return min(times), statistics.median(times)


def run_adamw(torch, args, sizes, make_optimizer):
    """{param_out: (best, median)} seconds of make_optimizer(params)'s step over tensors of
    `sizes`; "bf16" adds torch._foreach_copy_ of the fp32 masters into bf16 copies."""
    g = torch.Generator(device="cuda").manual_seed(args.sizes_seed)
    params, bf16 = [], []
    for n in sizes:
        p = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-1.0, 1.0, generator=g)
        p.requires_grad_(True)
        # zero-bench's ranges: positive gradients.
        p.grad = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(1e-3, 1e-2, generator=g)
        params.append(p)
        bf16.append(torch.empty(n, device="cuda", dtype=torch.bfloat16))
    opt = make_optimizer(params)
    masters = [p.detach() for p in params]

    def step_and_copy():
        opt.step()
        torch._foreach_copy_(bf16, masters)

    try:
        results = {"none": time_cuda(torch, opt.step, args.warmup, args.reps),
                   "bf16": time_cuda(torch, step_and_copy, args.warmup, args.reps)}
    finally:
        del opt, params, bf16, masters
        gc.collect()
        torch.cuda.empty_cache()
    return results


def run_torch(torch, args, sizes):
    """run_adamw with torch's fused AdamW."""
    return run_adamw(torch, args, sizes, lambda params: torch.optim.AdamW(
        params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True))


# --- DeepSpeed ---------------------------------------------------------------------------------

def deepspeed_peer(args):
    """The DeepSpeed peer's own process: FusedAdam over every size list of args.deepspeed_peer[0],
    {n: {param_out: [best, median]}} into args.deepspeed_peer[1]. Exit 0 when written."""
    import torch
    from deepspeed.ops.adam import FusedAdam
    sizes_file, out_file = args.deepspeed_peer
    times = {}
    for n, sizes in json.loads(sizes_file.read_text()).items():
        times[n] = run_adamw(torch, args, sizes, lambda params: FusedAdam(
            params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, adam_w_mode=True))
    out_file.write_text(json.dumps(times))
    return 0


def run_deepspeed(args, sizes_by_params, capability):
    """({params: {param_out: (best, median)}}, note): DeepSpeed's FusedAdam in a process of its own,
    or (None, why not)."""
    if args.deepspeed == "off":
        return None, "not measured (--deepspeed off)"
    if importlib.util.find_spec("deepspeed") is None:
        return None, "not measured: deepspeed does not import here"
    with tempfile.TemporaryDirectory() as tmp:
        sizes_file, out_file = Path(tmp) / "sizes.json", Path(tmp) / "times.json"
        sizes_file.write_text(json.dumps({str(n): s for n, s in sizes_by_params.items()}))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--deepspeed-peer", str(sizes_file),
               str(out_file), "--reps", str(args.reps), "--warmup", str(args.warmup),
               "--sizes-seed", str(args.sizes_seed)]
        # DeepSpeed's JIT builder reads TORCH_CUDA_ARCH_LIST and cannot parse an entry such as
        # "9.0a" (a GPU machine's image may set one): it is given this GPU's plain capability.
        env = dict(os.environ, TORCH_CUDA_ARCH_LIST=capability)
        print(f"$ TORCH_CUDA_ARCH_LIST={capability} " + " ".join(cmd), flush=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=args.deepspeed_timeout)
        except subprocess.TimeoutExpired:
            return None, (f"not measured: no result within {args.deepspeed_timeout} s "
                          "(its extension's build included)")
        if proc.returncode != 0 or not out_file.exists():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return None, f"not measured: its process exited {proc.returncode}: {tail}"
        times = json.loads(out_file.read_text())
    return {int(n): {k: tuple(v) for k, v in t.items()} for n, t in times.items()}, "measured"


def torch_copy(torch, args):
    """(bytes, best seconds) of a device-to-device copy of --copy-bytes."""
    elems = args.copy_bytes // 4
    src = torch.empty(elems, device="cuda", dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    try:
        best, _ = time_cuda(torch, lambda: dst.copy_(src), 2, args.reps)
    finally:
        del src, dst
        gc.collect()
        torch.cuda.empty_cache()
    return elems * 4, best


# --- the report --------------------------------------------------------------------------------

def compare(args, zero_records, torch_times, ds_times):
    rows = []
    for params in args.params:
        for out, (case, bytes_per_param) in CASES.items():
            z = zero_records[params][out]
            torch_best, torch_median = torch_times[params][out]
            zero_s = z["step_s"]
            rows.append({
                "params": params, "tensors": args.tensors, "case": case, "param_out": out,
                "bytes_per_param": bytes_per_param,
                "zero_step_s": zero_s, "zero_gb_per_s": z["gb_per_s"],
                "probe_step_s": z["probe_s"], "probe_gb_per_s": z["limit_gb_per_s"],
                "zero_probe_ratio": z["gb_per_s"] / z["limit_gb_per_s"],
                "torch_step_s": torch_best, "torch_step_median_s": torch_median,
                "torch_gb_per_s": params * bytes_per_param / torch_best / 1e9,
                "speedup": torch_best / zero_s,
            })
            if ds_times is not None:
                ds_best, ds_median = ds_times[params][out]
                rows[-1].update({"deepspeed_step_s": ds_best, "deepspeed_step_median_s": ds_median,
                                 "deepspeed_gb_per_s": params * bytes_per_param / ds_best / 1e9,
                                 "speedup_vs_deepspeed": ds_best / zero_s})
    return rows


def missed_targets(rows):
    missed = []
    for r in rows:
        where = f"{r['params']} params, {r['case']}"
        if r["zero_probe_ratio"] < TARGET_PROBE_RATIO:
            missed.append(f"{where}: zero/probe {r['zero_probe_ratio']:.3f} < {TARGET_PROBE_RATIO}")
        if r["speedup"] < TARGET_SPEEDUP:
            missed.append(f"{where}: zero is {r['speedup']:.3f}x torch < {TARGET_SPEEDUP}x")
    return missed


def print_table(rows, copy_gb_per_s, gpu, ds_note):
    ds = all("deepspeed_step_s" in r for r in rows)
    print(f"\nAdamW on {gpu}: zero (one multi-tensor step) against torch.optim.AdamW(fused=True)"
          f"{' and DeepSpeed FusedAdam' if ds else ''}, the same tensors, best of the timed steps")
    head = ("| params | tensors | case | B/param | zero ms | zero GB/s | probe GB/s | zero/probe | torch ms "
            "| torch GB/s | torch/zero time |")
    print(head + (" DeepSpeed ms | DeepSpeed/zero time |" if ds else ""))
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if ds else ""))
    for r in rows:
        line = (f"| {r['params']} | {r['tensors']} | {r['case']} | {r['bytes_per_param']} | "
                f"{r['zero_step_s'] * 1e3:.3f} | {r['zero_gb_per_s']:.0f} | {r['probe_gb_per_s']:.0f} | "
                f"{r['zero_probe_ratio']:.3f} | {r['torch_step_s'] * 1e3:.3f} | {r['torch_gb_per_s']:.0f} | "
                f"{r['speedup']:.3f} |")
        if ds:
            line += f" {r['deepspeed_step_s'] * 1e3:.3f} | {r['speedup_vs_deepspeed']:.3f} |"
        print(line)
    print(f"\ntorch device-to-device copy: {copy_gb_per_s:.0f} GB/s (read + write)")
    print(f"DeepSpeed FusedAdam: {ds_note}")


def main(argv=None):
    args = parse_args(argv)
    if args.deepspeed_peer:
        return deepspeed_peer(args)
    try:
        import torch
    except ImportError as e:
        print(f"cuda_optimizer_peers: cannot import torch ({e}); nothing measured", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("cuda_optimizer_peers: torch sees no CUDA GPU (torch.cuda.is_available() is false; "
              f"torch {torch.__version__}, built with CUDA {torch.version.cuda}); nothing measured",
              file=sys.stderr)
        return 2
    if not args.zero_bench.is_file():
        print(f"cuda_optimizer_peers: no zero-bench at {args.zero_bench} (build it, or pass --zero-bench)",
              file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    try:
        # Every zero-bench run first, each in its own process, then torch: never both on the GPU.
        zero_records = {n: run_zero(args, n) for n in args.params}
        torch_times = {}
        for n in args.params:
            print(f"torch: fused AdamW over {args.tensors} tensors, {n} params", flush=True)
            torch_times[n] = run_torch(torch, args, zero_records[n]["none"]["sizes"])
        copy_bytes, copy_s = torch_copy(torch, args)
        capability = "%d.%d" % torch.cuda.get_device_capability()
        ds_times, ds_note = run_deepspeed(args, {n: zero_records[n]["none"]["sizes"]
                                                 for n in args.params}, capability)
    except CannotMeasure as e:
        print(f"cuda_optimizer_peers: {e}", file=sys.stderr)
        return 2
    copy_gb_per_s = 2 * copy_bytes / copy_s / 1e9
    rows = compare(args, zero_records, torch_times, ds_times)
    print_table(rows, copy_gb_per_s, gpu, ds_note)
    missed = missed_targets(rows)
    if missed:
        print("targets: MISSED: " + "; ".join(missed))
    else:
        print(f"targets: met (zero/probe >= {TARGET_PROBE_RATIO} and zero >= {TARGET_SPEEDUP}x torch "
              "in every case)")
    if args.json:
        zero_runs = [{k: v for k, v in r.items() if k != "sizes"} for n in args.params
                     for r in zero_records[n].values()]
        report = {
            "bench": "cuda_optimizer_peers", "gpu": gpu, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "tensors": args.tensors, "sizes_seed": args.sizes_seed,
            "reps": args.reps, "warmup": args.warmup,
            "sizes": {str(n): zero_records[n]["none"]["sizes"] for n in args.params},
            "copy": {"bytes": copy_bytes, "seconds": copy_s, "gb_per_s": copy_gb_per_s},
            "results": rows, "zero_records": zero_runs, "deepspeed": ds_note,
            "targets": {"probe_ratio": TARGET_PROBE_RATIO, "speedup": TARGET_SPEEDUP, "met": not missed,
                        "missed": missed},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
