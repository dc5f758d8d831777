#!/usr/bin/env bash
# Developer probes on a GPU machine, for what scripts/gpu-check.sh measures but cannot explain
# (they replace none of its checks):
#   1. benchmarks/probes/cuda_norm_landing_probe.cu, built with nvcc and run: the squared norm's
#      kernels side by side at several sizes (their block sums bitwise equal) and 8 MiB landing
#      copies into pinned memory as the offloaded engine makes them;
#   2. with ncu on the PATH (or under /opt/nvidia/nsight-compute) and a built zero-bench: the
#      duration of every kernel of `zero-bench step --device cuda --stages 0` in launch order
#      (ncu-step.csv, summarised in ncu-step.txt), to tell a phase's kernel time from its waits;
#   3. the SASS of the norm kernels (norm-sass.txt), where cuobjdump is there;
#   4. with python3's torch and a built libzero.so: benchmarks/peers/cuda_train_peers.py at
#      stages 0 and 2 with --profile, two steps of each peer under torch.profiler (operators and
#      CUDA runtime calls such as cudaStreamSynchronize, with counts; the engine's timings) in
#      torch-profile/PEER.txt: where zero.initialize's backward spends the time torch's does not.
#
# Usage: [BUILD_DIR=build-gpu] [CUDA_ARCHS=90] [GPU_PROBE_NCU=0] [GPU_PROBE_TORCH=0]
#        scripts/gpu-probe.sh [OUT_DIR]
# (GPU_PROBE_NCU=0 skips item 2, about 30 s; GPU_PROBE_TORCH=0 item 4.)
# OUT_DIR defaults to $BUILD_DIR/probe. Exits 0 when every probe ran and the norm variants agreed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
out=${1:-$build/probe}
arch=${CUDA_ARCHS:-90}
mkdir -p "$out"
status=0

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
probe=$out/norm-landing-probe
if [ "${GPU_PROBE_NORM:-1}" = 0 ]; then
  echo "probe: norm and landing probe skipped (GPU_PROBE_NORM=0)"
elif "$nvcc" -O3 -std=c++20 -arch="sm_$arch" --fmad=false -Xcompiler -fopenmp -I"$root" \
  "$root/benchmarks/probes/cuda_norm_landing_probe.cu" -o "$probe" >"$out/probe-build.log" 2>&1; then
  timeout 180 "$probe" >"$out/norm-landing-probe.txt" 2>&1 || status=1
  cat "$out/norm-landing-probe.txt"
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  if [ -x "$cuobjdump" ]; then
    "$cuobjdump" -sass "$probe" 2>/dev/null |
      awk '/Function : .*squared_norm/{p=1} /Function : / && !/squared_norm/{p=0} p' \
        >"$out/norm-sass.txt"
  fi
else
  echo "probe: the build failed:"
  tail -n 20 "$out/probe-build.log"
  status=1
fi

ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
bench=$build/benchmarks/zero-bench
if [ "${GPU_PROBE_NCU:-1}" = 0 ]; then
  echo "probe: kernel durations skipped (GPU_PROBE_NCU=0)"
elif [ -z "$ncu" ]; then
  echo "probe: no ncu; kernel durations not taken"
  status=1
elif [ ! -x "$bench" ]; then
  echo "probe: $bench not built; kernel durations not taken"
  status=1
else
  timeout 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
    --launch-count 3000 --log-file "$out/ncu-step.csv" \
    "$bench" step --device cuda --world-size 1 --params 64M --stages 0 --steps 2 \
    >"$out/ncu-step.out" 2>&1 || status=1
  python3 - "$out/ncu-step.csv" >"$out/ncu-step.txt" <<'EOF' || status=1
import csv, sys
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    us = v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
    rows.append((int(r["ID"]), r["Kernel Name"].split("(")[0][-60:], us))
rows.sort()
print(f"{len(rows)} kernels")
# Launch order, runs of one kernel folded: count, total and largest duration.
run = None
for _, name, us in rows + [(None, None, 0.0)]:
    if run and name == run[0]:
        run[1] += 1; run[2] += us; run[3] = max(run[3], us)
        continue
    if run:
        print(f"{run[1]:5d} x {run[0]:60s} total {run[2]:10.1f} us  max {run[3]:9.1f} us")
    run = [name, 1, us, us] if name else None
EOF
  tail -n 80 "$out/ncu-step.txt"
fi
library=$build/libzero.so
if [ "${GPU_PROBE_TORCH:-1}" = 0 ]; then
  echo "probe: torch profile skipped (GPU_PROBE_TORCH=0)"
elif [ ! -f "$library" ]; then
  echo "probe: $library not built; no torch profile"
  status=1
else
  timeout 150 env -C "$root" ZERO_LIBRARY="$library" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
    python3 "$root/benchmarks/peers/cuda_train_peers.py" --stages "${GPU_PROBE_STAGES:-0,2}" --steps 3 --warmup 2 \
    --profile "$out/torch-profile" >"$out/torch-profile.log" 2>&1 || status=1
  tail -n 8 "$out/torch-profile.log"
fi
exit $status
