"""Writes scripts/gpu-check.sh's summary.json and prints its summary for people.

    python3 gpu_check_summary.py OUT_DIR PARTS_TSV

PARTS_TSV has one line per part: name, status (PASS, FAIL or NOT RUN), seconds, detail, and the
part's files (comma-separated, relative to OUT_DIR), tab-separated. The machine and toolchain come
from the environment gpu-check.sh sets (GPU_CHECK_*). Exits 1 when a part failed, else 0.
"""

import json
import os
import sys

STATUSES = ("PASS", "FAIL", "NOT RUN")


def read_parts(path):
    parts = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            fields += [""] * (5 - len(fields))
            name, status, seconds, detail, files = fields[:5]
            if status not in STATUSES:  # a malformed record never reads as a pass
                detail = f"gpu-check recorded status {status!r}: {detail}"
                status = "FAIL"
            try:
                seconds = round(float(seconds), 1)
            except ValueError:
                seconds = None
            parts.append({"name": name, "status": status, "seconds": seconds,
                          "detail": detail, "files": [p for p in files.split(",") if p]})
    return parts


def main():
    out_dir, parts_tsv = sys.argv[1], sys.argv[2]
    env = os.environ.get
    parts = read_parts(parts_tsv)
    counts = {s: sum(p["status"] == s for p in parts) for s in STATUSES}
    summary = {
        "commit": env("GPU_CHECK_COMMIT", "unknown"),
        "commit_source": env("GPU_CHECK_COMMIT_SOURCE", "unknown"),
        "date": env("GPU_CHECK_DATE", ""),
        "seconds": float(env("GPU_CHECK_SECONDS", "0") or 0),
        "gpu": env("GPU_CHECK_GPU", ""),
        "nvcc": env("GPU_CHECK_NVCC", ""),
        "compiler": env("GPU_CHECK_COMPILER", ""),
        "cmake": env("GPU_CHECK_CMAKE", ""),
        "generator": env("GPU_CHECK_GENERATOR", ""),
        "cuda_architectures": env("GPU_CHECK_CUDA_ARCHS", ""),
        "offline_deps": env("GPU_CHECK_OFFLINE_DEPS", ""),
        "counts": counts,
        "passed": counts["FAIL"] == 0 and counts["NOT RUN"] == 0,
        "parts": parts,
    }
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    lines = [f"== gpu-check {summary['date']}  commit {summary['commit']}"
             f" ({summary['commit_source']})",
             f"   GPU: {summary['gpu'] or 'none found'}",
             f"   {summary['nvcc']}; {summary['compiler']}; {summary['cmake']}"]
    for p in parts:
        seconds = "" if p["seconds"] is None else f"{p['seconds']:.0f}s"
        lines.append(f"{p['status']:<8} {p['name']:<44} {seconds:>5}  {p['detail']}")
    lines.append(f"== {counts['PASS']} passed, {counts['FAIL']} failed, {counts['NOT RUN']} not run"
                 f"; every file in {out_dir}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    sys.stdout.write(text)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
