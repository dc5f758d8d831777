#!/usr/bin/env python3
"""Turns `zero-train --json` and `zero-bench ... --json` output into one PNG.

usage: scripts/plot.sh FILE.jsonl [FILE.jsonl ...] OUT.png

Every line of every input that is a JSON object is read; other lines are ignored, so a captured
log works as well. Panels, for what the input holds:
  * training (zero-train's per-step objects): loss per optimizer step on a log scale, the learning
    rate on a second axis, skipped steps marked;
  * memory (zero-train's summary; zero-bench step's records): peak bytes per rank by ledger tag,
    stacked, one bar per rank (training) or per stage (benchmark), the ZeRO paper's formula as a
    marker where the input carries it;
  * step breakdown (zero-bench step): ms per step by phase, stacked, per stage, with the step's
    limit (the bytes every phase must move at the measured memcpy speed) as a marker;
  * ratios (every zero-bench record with a "ratio"): each benchmark's ratio to the limit it was
    measured against in the same run (memcpy, traffic probe, sequential I/O), one bar per record;
    for zero-bench step, the whole step's step_limit_ratio.
Exit status: 0 written, 1 nothing to plot or unreadable input, 2 bad usage.
"""
import json
import sys

MIB = 1024 * 1024


def read_records(paths):
    records = []
    for path in paths:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"plot: {path}:{number}: not JSON ({e.msg}); is the file "
                                     "cut short?") from None
    return records


def training_steps(records):
    return [r for r in records if "step" in r and "loss" in r and "bench" not in r]


def training_summaries(records):
    return [r for r in records if "memory" in r and "final_loss" in r]


def bench_records(records, bench=None):
    return [r for r in records if "bench" in r and (bench is None or r["bench"] == bench)]


def record_label(r):
    """What tells a benchmark record apart from the others of its kind, shortest first."""
    keys = ("prefetch_enabled", "backend", "op", "tier", "optimizer", "grad_dtype", "state_dtype", "param_out", "dtype",
            "precision", "stage", "world_size", "bytes_per_rank", "params", "elems", "model")
    parts = [r["bench"]]
    for k in keys:
        if k in r and r[k] not in (None, "none"):
            v = r[k]
            if k == "prefetch_enabled":
                v = "prefetch" if v else None
            elif k == "bytes_per_rank":
                v = f"{v / MIB:g} MiB" if v >= MIB else f"{v} B"
            elif k == "stage":
                v = f"stage {v}"
            elif k == "world_size":
                v = f"{v} ranks"
            elif k in ("params", "elems"):
                v = f"{v:,} {k}"
            if v is not None:
                parts.append(str(v))
    return " ".join(parts)


def plot_training(ax, steps):
    xs = [s["step"] for s in steps]
    ax.plot(xs, [s["loss"] for s in steps], color="tab:blue", label="loss")
    skipped = [s for s in steps if s.get("skipped")]
    if skipped:
        ax.scatter([s["step"] for s in skipped], [s["loss"] for s in skipped], color="tab:red",
                   marker="x", zorder=3, label="skipped step")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    lr = ax.twinx()
    lr.plot(xs, [s["lr"] for s in steps], color="tab:orange", linestyle="--", label="lr")
    lr.set_ylabel("learning rate")
    lines = ax.get_legend_handles_labels()
    more = lr.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right")
    ax.set_title("training: loss and learning rate per optimizer step")


def stacked_bars(ax, labels, by_tag, scale, unit, markers=None, marker_label=None):
    """One bar per label, stacked by tag (by_tag: list of {tag: value}), values / scale."""
    tags = []
    for d in by_tag:
        for t, v in d.items():
            if v and t not in tags:
                tags.append(t)
    bottoms = [0.0] * len(labels)
    for t in tags:
        heights = [d.get(t, 0) / scale for d in by_tag]
        ax.bar(labels, heights, bottom=bottoms, label=t)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    if markers is not None:
        ax.scatter(labels, [m / scale if m is not None else float("nan") for m in markers],
                   color="black", marker="_", s=600, linewidths=2, zorder=3, label=marker_label)
    ax.set_ylabel(unit)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_training_memory(ax, summary):
    ranks = summary["memory"]
    labels = [f"rank {m['rank']}" for m in ranks]
    by_tag = [{t: v["peak_bytes"] for t, v in m["by_tag"].items()} for m in ranks]
    estimate = summary.get("estimate", {}).get("total_bytes")
    stacked_bars(ax, labels, by_tag, MIB, "peak MiB", [estimate] * len(labels),
                 "ZeRO formula" if estimate else None)
    ax.set_title("training: peak memory per rank by tag (each tag's own peak)")


def step_label(r):
    prefetch = ", prefetch" if r.get("prefetch_enabled", r.get("prefetch")) else ""
    return f"stage {r['stage']}{prefetch}\n{r['precision']}, {r['world_size']} ranks"


def plot_step_memory(ax, steps):
    stacked_bars(ax, [step_label(r) for r in steps], [r["peak_bytes_by_tag"] for r in steps], MIB,
                 "peak MiB per rank", [r.get("zero_formula_bytes_per_rank") for r in steps],
                 "ZeRO formula")
    ax.set_title(f"zero-bench step ({steps[0]['model']}): peak memory per rank by tag")


def plot_step_breakdown(ax, steps):
    phases = [dict(r["breakdown_s"], other=r["other_s"]) for r in steps]
    stacked_bars(ax, [step_label(r) for r in steps], phases, 1e-3, "ms per step",
                 [r.get("step_limit_s") for r in steps], "limit (bytes at memcpy speed)")
    ax.set_title(f"zero-bench step ({steps[0]['model']}): where a step goes")


def ratio_of(r):
    """(ratio, what it is a ratio to): a step record's whole-step ratio, else the record's own."""
    if r.get("bench") == "step" and isinstance(r.get("step_limit_ratio"), (int, float)):
        return r["step_limit_ratio"], "its bytes at memcpy speed"
    if isinstance(r.get("ratio"), (int, float)):
        return r["ratio"], r.get("limit", "its limit")
    return None


def plot_ratios(ax, rated):
    labels = [record_label(r) for r in rated]
    values = [ratio_of(r)[0] for r in rated]
    ys = range(len(rated))
    ax.barh(ys, values, color=["tab:green" if v >= 0.5 else "tab:red" for v in values])
    ax.set_yticks(list(ys), labels, fontsize="small")
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, r, v in zip(ys, rated, values):
        ax.text(v, y, f" {v:.2f} of {ratio_of(r)[1]}", va="center", fontsize="x-small")
    ax.set_xlabel("ratio to the limit measured in the same run")
    ax.set_title("benchmarks: each against its limit")
    return len(rated)


def main(argv):
    if len(argv) < 3 or any(a in ("-h", "--help") for a in argv[1:]):
        print(__doc__.strip(), file=sys.stderr if len(argv) < 3 else sys.stdout)
        return 2 if len(argv) < 3 else 0
    *inputs, out = argv[1:]
    if not out.endswith(".png"):
        print(f"plot: the last argument is the picture to write and must end in .png, got {out!r}",
              file=sys.stderr)
        return 2
    try:
        records = read_records(inputs)
    except OSError as e:
        print(f"plot: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 1

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []  # (height in inches, draw(ax))
    steps = training_steps(records)
    if steps:
        panels.append((3.5, lambda ax: plot_training(ax, steps)))
    summaries = training_summaries(records)
    if summaries:
        panels.append((3.5, lambda ax: plot_training_memory(ax, summaries[-1])))
    step_bench = bench_records(records, "step")
    if step_bench:
        panels.append((3.5, lambda ax: plot_step_breakdown(ax, step_bench)))
        panels.append((3.5, lambda ax: plot_step_memory(ax, step_bench)))
    rated = [r for r in bench_records(records) if ratio_of(r) is not None]
    if rated:
        panels.append((1.0 + 0.22 * len(rated), lambda ax: plot_ratios(ax, rated)))
    if not panels:
        print(f"plot: nothing to plot in {', '.join(inputs)}: expected zero-train --json or "
              "zero-bench --json lines", file=sys.stderr)
        return 1

    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(h for h, _ in panels)),
                             gridspec_kw={"height_ratios": [h for h, _ in panels]}, squeeze=False)
    for (_, draw), ax in zip(panels, axes[:, 0]):
        draw(ax)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: wrote {out} ({len(panels)} panels from {len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
