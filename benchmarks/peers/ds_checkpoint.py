#!/usr/bin/env python3
"""zero's DeepSpeed-checkpoint conversion next to DeepSpeed's own zero_to_fp32, in one session.

    python benchmarks/peers/ds_checkpoint.py DS_CHECKPOINT_DIR [--reps 3] [--build build]
                                             [--work /tmp/ds-checkpoint-peer] [--json]

Alternates R times: `zero-bench checkpoint --deepspeed DIR` (its deepspeed_to_fp32 row: zero's
zero_to_fp32 as a child process, wall time and peak RSS from wait4) and DeepSpeed's
`python -m deepspeed.utils.zero_to_fp32 DIR OUT --safe_serialization` (needs deepspeed and
huggingface_hub; wall time and peak RSS the same way). Prints the medians, then checks that both
outputs (zero's written once more by build/tools/zero_to_fp32) hold the same tensors bit for bit. Make a checkpoint to run it on with
`python scripts/make_ds_checkpoints.py OUT --kinds big --big-params 100000000`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd, env=None):
    """(seconds, peak RSS bytes) of a child process; raises when it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed (status {status}):\n{out[-2000:]}")
    return seconds, usage.ru_maxrss * 1024, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=str(Path(__file__).resolve().parents[2] / "build"))
    ap.add_argument("--work", default="/tmp/ds-checkpoint-peer")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    bench = Path(a.build) / "benchmarks" / "zero-bench"
    if not os.access(bench, os.X_OK):
        sys.exit(f"{bench}: not built; run scripts/build.sh (or pass --build)")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ds_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    rows = {"zero": [], "deepspeed": []}
    for _ in range(a.reps):
        _, _, out = timed([bench, "checkpoint", "--deepspeed", a.checkpoint, "--params", "1000000",
                           "--reps", "1", "--dir", work / "zero", "--json"])
        row = [json.loads(l) for l in out.splitlines() if '"deepspeed_to_fp32"' in l][-1]
        rows["zero"].append((row["seconds"], row["peak_rss_bytes"]))
        s, rss, _ = timed([sys.executable, "-m", "deepspeed.utils.zero_to_fp32", a.checkpoint,
                           work / "deepspeed", "--safe_serialization"], env=ds_env)
        rows["deepspeed"].append((s, rss))

    # zero-bench removes what it wrote: convert once more for the comparison.
    timed([Path(a.build) / "tools" / "zero_to_fp32", a.checkpoint, work / "zero.safetensors"])
    from safetensors.torch import load_file
    import torch
    ours = load_file(str(work / "zero.safetensors"))
    theirs = {}
    for f in sorted((work / "deepspeed").glob("*.safetensors")):
        theirs.update(load_file(str(f)))
    same = sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    params = sum(t.numel() for t in theirs.values())

    result = {"checkpoint": a.checkpoint, "params": params, "reps": a.reps, "bitwise_equal": same}
    for who, r in rows.items():
        result[who] = {"seconds": statistics.median(x for x, _ in r),
                       "peak_rss_bytes": statistics.median(y for _, y in r)}
    result["time_ratio"] = result["zero"]["seconds"] / result["deepspeed"]["seconds"]
    result["rss_ratio"] = result["zero"]["peak_rss_bytes"] / result["deepspeed"]["peak_rss_bytes"]
    if a.json:
        print(json.dumps(result))
    else:
        print(f"{a.checkpoint}: {params / 1e6:.1f}M parameters, median of {a.reps}")
        for who in ("zero", "deepspeed"):
            print(f"  {who:10s} {result[who]['seconds']:7.2f} s   peak RSS "
                  f"{result[who]['peak_rss_bytes'] / 2**20:8.1f} MiB")
        print(f"  zero / DeepSpeed: time {result['time_ratio']:.2f}, peak RSS "
              f"{result['rss_ratio']:.3f}; outputs bitwise equal: {same}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
