"""What benchmarks/peers/torch_peers.py prints: the figures a run records, the ratios against
the best peer (refused where a baseline is not positive), the optimizer's traffic limit from
zero-bench's probe, and the markdown report."""
import json
import os
import statistics
import subprocess
import sys

import torch

import common

TIMES = ("ms_step", "ms_forward", "ms_backward", "ms_outside", "cpu_ms_step")
# With --paired, the run's figures against its paired bare steps (paired_figures).
PAIRED = ("ms_engine_paired", "cpu_ms_engine_paired", "backward_over_paired_bare", "ms_paired_bare_step",
          "ms_outside_job")


NOISY = " (the bare run was as slow or slower in a noisy moment); rerun with more --repeats"
NOISY_PAIRED = " (its steps were no slower than the bare steps beside them); rerun with more --repeats"


def engine_ratios(rows):
    """{zero stage: {...}} for every zero row that has a peer at its stage (DDP counts at stage 0,
    FSDP2 at 3, DeepSpeed at its own), against the best peer. With paired bare steps (--paired,
    every row has them) the engine shares are the paired ones and the best peer is the one with
    the smallest paired share; otherwise the shares subtract the bare run's step and the best peer
    is the one with the shortest step (then also the smallest share). Keys: paired (which shares),
    zero_ms, best_peer, best_peer_ms (engine shares, None without a bare run or pairing), ratio
    (their ratio, or None) and ratio_refused (why None, else None); zero_step_ms,
    best_peer_step_ms and step_ratio (the whole steps' ratio, or None) and step_ratio_refused."""
    by_peer = {r["peer"]: r for r in rows if r["peer"] != "bare"}
    paired = bool(by_peer) and all("ms_engine_paired" in r for r in by_peer.values())
    share = "ms_engine_paired" if paired else "ms_engine"
    out = {}
    for peer, r in by_peer.items():
        kind, _, stage = peer.partition("-s")
        if kind != "zero":
            continue
        others = [p for p in ("ddp", "fsdp2", f"deepspeed-s{stage}") if p in by_peer]
        if not others:
            continue
        best = min(others, key=lambda p: by_peer[p]["ms_engine_paired" if paired else "ms_step"])
        mine, theirs = r.get(share), by_peer[best].get(share)
        engine, engine_why = common.ratio_or_refusal(mine, theirs, "zero", best, "engine share",
                                              NOISY_PAIRED if paired else NOISY)
        step, step_why = common.ratio_or_refusal(r["ms_step"], by_peer[best]["ms_step"], "zero", best, "step")
        out[int(stage)] = {"paired": paired, "zero_ms": mine, "best_peer": best, "best_peer_ms": theirs,
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
        what = "engine share (step - paired bare step)" if v["paired"] else "engine share (step - bare)"
        if v["zero_ms"] is None or v["best_peer_ms"] is None:
            engine = "engine share: none without a bare run"
        elif v["ratio"] is not None:
            engine = (f"{what} {v['zero_ms']:.1f} ms = {v['ratio']:.2f}x the best peer's "
                      f"({best}, {v['best_peer_ms']:.1f} ms)")
        else:
            engine = (f"{what} {v['zero_ms']:.1f} ms against {best}'s {v['best_peer_ms']:.1f} ms: "
                      f"no ratio, {v['ratio_refused']}")
        lines.append(f"zero stage {stage}: {step}; {engine}")
    return lines


def zero_bench_path(args):
    """The zero-bench to take the traffic probe from: --zero-bench, else the repository's build."""
    path = args.zero_bench or os.path.join(common.REPO, "build", "benchmarks", "zero-bench")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


PROBE_ROUNDS = 3


def optimizer_limits(args, stages, numel):
    """{stage: {...}}: the least time the optimizer's own traffic takes on one rank, from
    zero-bench's traffic probe run on as many processes at once as the ranks (they share the
    memory bus as the ranks do): AdamW over the rank's partition (the whole model at stage 0, a
    1/N share at stages 1-3; stage 0's "shared_step" entry the 1/N share too, for a zero that
    shares its step out), its bytes per parameter from zero-bench (fp32: gradient, master
    and two states; bf16: a bf16 gradient and a bf16 model copy written besides). The probe's
    speed is the slowest process's in a round, the median of PROBE_ROUNDS rounds (one round's
    varied by 2x on this machine). Measured twice: warm, the probe's passes repeated over the same
    arrays (what the last-level cache keeps of them helps: the issue's limit), and cold
    (zero-bench kernels --cold: every pass starts from caches that hold none of them, as a step
    does after forward and backward). None without zero-bench."""
    bench = zero_bench_path(args)
    if bench is None:
        print("torch_peers: no zero-bench (build it, or pass --zero-bench): no optimizer limit",
              file=sys.stderr)
        return None
    grad, out = ("bf16", "bf16") if args.dtype == "bf16" else ("fp32", "none")
    share = -(-numel // args.nproc)
    probed = {}

    def probe(part):
        if part not in probed:
            probed[part] = probe_partition(args, bench, grad, out, part)
        return probed[part]
    limits = {}
    for stage in stages:
        limits[stage] = dict(probe(numel if stage == 0 else share))
        if stage == 0 and args.nproc > 1:
            # Where zero's stage 0 shares its step out (pushed_bytes > 0: each rank steps a 1/N
            # share and pushes it), its rank's partition is that share: limit_lines takes this.
            limits[stage]["shared_step"] = probe(share)
    return limits


def probe_partition(args, bench, grad, out, part):
    """optimizer_limits' entry for a partition of `part` parameters."""
    cmd = [bench, "kernels", "--json", "--params", str(part), "--threads", "1", "--reps", "7",
           "--optimizer", "adamw", "--grad-dtype", grad, "--state-dtype", "fp32"]
    limit = {"partition_params": part}
    for kind, extra in (("", []), ("cold_", ["--cold"])):
        rounds = []
        for _ in range(PROBE_ROUNDS):
            procs = [subprocess.Popen(cmd + extra, stdout=subprocess.PIPE, text=True,
                                      env=common.one_thread_env())
                     for _ in range(args.nproc)]
            records = []
            for proc in procs:
                text, _ = proc.communicate(timeout=args.timeout)
                if proc.returncode != 0:
                    raise SystemExit(f"torch_peers: {' '.join(cmd + extra)} failed (exit {proc.returncode})")
                records += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            mine = [r for r in records if r["param_out"] == out]
            if len(mine) != args.nproc:
                raise SystemExit(f"torch_peers: zero-bench gave {len(mine)} records for AdamW "
                                 f"{grad}/fp32 out {out}, expected {args.nproc}")
            # The slowest process's probe: every rank has to finish its step.
            rounds.append(min(r["limit_gb_per_s"] for r in mine))
        gb_per_s = statistics.median(rounds)
        limit["bytes_per_param"] = mine[0]["bytes_per_param"]
        limit.update({f"{kind}probe_gb_per_s": gb_per_s, f"{kind}probe_rounds_gb_per_s": rounds,
                      f"{kind}limit_ms": part * mine[0]["bytes_per_param"] / (gb_per_s * 1e9) * 1e3})
    return limit


def limit_lines(rows, limits):
    """One line per zero stage: the time outside forward and backward against the optimizer's
    traffic limit for the rank's partition."""
    lines = []
    for r in rows:
        kind, _, stage = r["peer"].partition("-s")
        if kind != "zero" or limits is None or int(stage) not in limits:
            continue
        lim = limits[int(stage)]
        shared = "shared_step" in lim and r.get("profile", {}).get("pushed_bytes", 0) > 0
        if shared:
            lim = lim["shared_step"]
        # With --paired, the job's time outside (the slowest rank's wait for the other excluded).
        outside, what = (r["ms_outside_job"], "the job's time outside fwd+bwd") if "ms_outside_job" in r \
            else (r["ms_outside"], "outside fwd+bwd")
        lines.append(f"zero stage {stage}: {what} {outside:.1f} ms = "
                     f"{outside / lim['limit_ms']:.2f}x the optimizer's traffic limit "
                     f"({lim['partition_params'] / 1e6:.2f}M params x {lim['bytes_per_param']} B at "
                     f"{lim['probe_gb_per_s']:.1f} GB/s = {lim['limit_ms']:.1f} ms), "
                     f"{outside / lim['cold_limit_ms']:.2f}x its cold limit "
                     f"({lim['cold_probe_gb_per_s']:.1f} GB/s = {lim['cold_limit_ms']:.1f} ms)"
                     + (", the step shared out (each rank steps a 1/N share)" if shared else ""))
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


def outside_lines(rows):
    """zero's outside_phases, one column per stage: the job's time outside forward and backward
    split as the rank that finished backward last spent it."""
    split = [r for r in rows if "outside_phases" in r]
    if not split:
        return []
    headers = ["the job's outside, per step, ms (the rank last out of backward)", *(r["peer"] for r in split)]
    keys = list(split[0]["outside_phases"])
    table = [[k, *(f"{r['outside_phases'][k]:.2f}" for r in split)] for k in keys]
    table.append(["job's outside (median)", *(f"{r['ms_outside_job']:.2f}" for r in split)])
    return ["", *common.markdown_table(headers, table)]


def markdown(rows, args, numel):
    kinds = {"zero": "zero", "deepspeed": "DeepSpeed", "ddp": "PyTorch DDP (gloo)", "fsdp2": "PyTorch FSDP2 (gloo)",
             "bare": "bare forward+backward"}
    table = []
    for r in rows:
        kind, _, stage = r["peer"].partition("-s")
        stage = stage or {"ddp": "(0)", "fsdp2": "(3)", "bare": ""}[kind]
        def cell(key, form="{:.1f}"):
            return form.format(r[key]) if key in r else ""

        loss = "" if kind == "bare" else f"{r['last_loss']:.6f}"
        table.append([kinds[kind], stage, *(f"{r[key]:.1f}" for key in TIMES), cell("ms_outside_job"), cell("ms_engine"),
                      cell("cpu_ms_engine"), cell("ms_engine_paired"), cell("cpu_ms_engine_paired"),
                      cell("backward_over_paired_bare", "{:.3f}"), f"{r['peak_rss_mib']:.0f}", loss])
    headers = ["peer", "ZeRO stage", "ms/step", "forward ms", "backward ms", "outside fwd+bwd ms",
               "CPU ms/step", "job's outside ms (paired)", "engine ms (step - bare)", "engine CPU ms", "engine ms (paired)",
               "engine CPU ms (paired)", "backward / paired bare", "peak RSS MiB/process",
               "last loss"]
    lines = [f"{args.model} ({numel / 1e6:.1f}M parameters, {args.dtype}), {args.nproc} processes, "
             f"{args.steps} steps after {args.warmup} warm-up, median of {args.repeats} alternating "
             f"repeats (torch {torch.__version__}, CPU)"
             + ("" if args.overlap_comm == "default" else f", overlap_comm {args.overlap_comm}")
             + ("" if args.stage3_persistence == "default" else ", stage 3 with every unit persistent"),
             args.zero_what, "",
             *common.markdown_table(headers, table, left=2)]
    ratios = engine_ratios(rows)
    if ratios:
        lines += ["", *ratio_lines(ratios)]
    bare = next((r for r in rows if r["peer"] == "bare"), None)
    zero_rows = [r for r in rows if r["peer"].startswith("zero")]
    if bare is not None or any("backward_over_paired_bare" in r for r in zero_rows):
        lines.append("")
    for r in zero_rows:
        parts = []
        if bare is not None:
            parts.append(f"{r['ms_backward'] / bare['ms_backward']:.3f}x the bare run's")
        if "backward_over_paired_bare" in r:
            parts.append(f"{r['backward_over_paired_bare']:.3f}x the paired bare steps'")
        if parts:
            lines.append(f"{r['peer']}: backward {r['ms_backward']:.1f} ms = {', '.join(parts)}")
    limit = limit_lines(rows, args.limits)
    if limit:
        lines += ["", *limit]
    return "\n".join(lines + outside_lines(rows) + profile_lines(rows))
