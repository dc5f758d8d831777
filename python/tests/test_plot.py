"""scripts/plot.py: zero-train and zero-bench JSON lines into one PNG, and its errors."""
import json
import struct
import subprocess
import sys
from pathlib import Path

PLOT = Path(__file__).resolve().parents[2] / "scripts" / "plot.py"

# The shapes zero-train --json and zero-bench --json print (fields the plot reads, values made up).
TRAIN = [{"step": s, "loss": 0.5 / s, "lr": 1e-3 * min(1, s / 3), "grad_norm": 1.0, "loss_scale": 1.0,
          "skipped": s == 2, "step_time_s": 0.01, "model_time_s": 0.005} for s in range(1, 11)]
SUMMARY = {"final_loss": 0.05, "first_loss": 0.5, "estimate": {"total_bytes": 3e6},
           "memory": [{"rank": r, "by_tag": {"master_params": {"peak_bytes": 1e6, "current_bytes": 1e6},
                                             "optimizer_states": {"peak_bytes": 2e6, "current_bytes": 2e6},
                                             "other": {"peak_bytes": 0, "current_bytes": 0}}} for r in (0, 1)]}
STEP = [{"bench": "step", "stage": s, "world_size": 2, "precision": "bf16", "model": "mlp:8,8",
         "prefetch_enabled": False, "breakdown_s": {"pack": 1e-3, "optimizer": 2e-3}, "other_s": 1e-3,
         "step_limit_s": 2e-3, "step_limit_ratio": 0.5, "ratio": 0.9, "limit": "memcpy",
         "peak_bytes_by_tag": {"master_params": 1e6, "buckets": 5e5},
         "zero_formula_bytes_per_rank": 1.2e6} for s in (0, 3)]
COMM = [{"bench": "comm", "backend": "inproc", "op": "all_reduce", "dtype": "fp32", "world_size": 2,
         "bytes_per_rank": 1 << 20, "ratio": 0.7, "limit": "memcpy"}]


def plot(tmp_path, *files, out="out.png"):
    return subprocess.run([sys.executable, str(PLOT), *map(str, files), str(tmp_path / out)],
                          capture_output=True, text=True, timeout=120)


def write_lines(path, records, noise=()):
    path.write_text("".join(list(noise) + [json.dumps(r) + "\n" for r in records]))
    return path


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_training_and_benchmarks_become_one_picture_with_a_panel_each(tmp_path):
    train = write_lines(tmp_path / "train.jsonl", TRAIN + [SUMMARY], noise=["zero-train: a log line\n"])
    bench = write_lines(tmp_path / "bench.jsonl", STEP + COMM)
    r = plot(tmp_path, train, bench)
    assert r.returncode == 0, r.stderr
    # loss, training memory, step breakdown, step memory, ratios
    assert "5 panels from 14 records" in r.stdout
    width, height = png_size(tmp_path / "out.png")
    assert width > 500 and height > 5 * 200


def test_only_what_the_input_holds_is_drawn(tmp_path):
    r = plot(tmp_path, write_lines(tmp_path / "comm.jsonl", COMM))
    assert r.returncode == 0, r.stderr
    assert "1 panels from 1 records" in r.stdout
    png_size(tmp_path / "out.png")


def test_errors_name_the_problem(tmp_path):
    empty = write_lines(tmp_path / "log.txt", [], noise=["no json here\n"])
    r = plot(tmp_path, empty)
    assert r.returncode == 1 and "nothing to plot in" in r.stderr and not (tmp_path / "out.png").exists()

    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps(COMM[0]) + "\n" + json.dumps(COMM[0])[:20] + "\n")
    r = plot(tmp_path, cut)
    assert r.returncode == 1 and f"{cut}:2: not JSON" in r.stderr

    r = plot(tmp_path, tmp_path / "missing.jsonl")
    assert r.returncode == 1 and "cannot read" in r.stderr and "missing.jsonl" in r.stderr

    r = plot(tmp_path, write_lines(tmp_path / "c.jsonl", COMM), out="out.svg")
    assert r.returncode == 2 and "must end in .png" in r.stderr

    r = subprocess.run([sys.executable, str(PLOT), "only-one-argument"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage: scripts/plot.sh" in r.stderr
