#!/usr/bin/env bash
# What has to pass on a GPU machine before zero may claim anything about GPUs (issue 16).
# From a clean clone: builds with CUDA required (-DZERO_WITH_CUDA=ON; nvcc, NCCL and cuBLAS from
# the toolkit), runs every test labelled "gpu" — a GPU test that skips (exit 77) counts as a
# FAILURE here, since on this machine it must run — then the GPU benchmarks and the main job on
# the GPU where zero has them, and prints one summary. Exits non-zero when anything failed.
#
#   scripts/gpu-check.sh [extra CMake arguments]
#   BUILD_DIR=build-gpu (default)   CUDA_ARCHS="80;90" (default: the project's default list)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
log_dir="$build/gpu-check"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

declare -a summary=()
failed=0
record() {  # record STATUS NAME DETAIL
  summary+=("$(printf '%-15s %-34s %s' "$1" "$2" "$3")")
  if [ "$1" = FAIL ]; then failed=1; fi
}

# --- the machine --------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | wc -l)
  record PASS "GPUs visible" "$gpus ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1))"
else
  gpus=0
  record FAIL "GPUs visible" "nvidia-smi finds no GPU: this script is for a GPU machine"
fi

# --- build with CUDA required ---------------------------------------------------------------------
mkdir -p "$log_dir"
cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_WERROR=ON
            -DZERO_WITH_CUDA=ON)
if [ -n "${CUDA_ARCHS:-}" ]; then cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"); fi
if cmake "${cmake_args[@]}" "$@" >"$log_dir/configure.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" >"$log_dir/build.log" 2>&1; then
  record PASS "build (ZERO_WITH_CUDA=ON)" "$(grep -E '✓ (CUDA|NCCL|cuBLAS)' "$log_dir/configure.log" | tr -s ' ' | paste -sd ';')"
else
  record FAIL "build (ZERO_WITH_CUDA=ON)" "see $log_dir/configure.log and build.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi

# --- GPU tests: every one must run, none may skip ------------------------------------------------
ctest --test-dir "$build" -L gpu --output-on-failure >"$log_dir/gpu-tests.log" 2>&1
ctest_rc=$?
ran=$(grep -cE 'Test +#[0-9]+: ' "$log_dir/gpu-tests.log")
skipped=$(grep -E 'Test +#[0-9]+: .*Skipped' "$log_dir/gpu-tests.log" | awk '{print $4}' | paste -sd ' ')
if [ "$ran" -eq 0 ]; then
  record FAIL "GPU tests (ctest -L gpu)" "no test carries the gpu label"
elif [ -n "$skipped" ]; then
  record FAIL "GPU tests (ctest -L gpu)" "skipped on a GPU machine: $skipped"
elif [ $ctest_rc -ne 0 ]; then
  record FAIL "GPU tests (ctest -L gpu)" "$(grep -E 'tests passed|tests failed' "$log_dir/gpu-tests.log")"
else
  record PASS "GPU tests (ctest -L gpu)" "$ran tests; log $log_dir/gpu-tests.log"
fi

# --- the whole suite, for what the CUDA build changes on the CPU side -----------------------------
if ctest --test-dir "$build" -LE gpu -j "$(nproc)" >"$log_dir/cpu-tests.log" 2>&1; then
  record PASS "CPU tests in the CUDA build" "$(grep -E 'tests passed' "$log_dir/cpu-tests.log")"
else
  record FAIL "CPU tests in the CUDA build" "$(grep -E 'tests failed' "$log_dir/cpu-tests.log")"
fi

# --- benchmarks and the main job on the GPU -------------------------------------------------------
# optional NAME PROBE-PATTERN HELP-COMMAND -- RUN-COMMAND...: runs what exists, names what does not.
optional() {
  local name=$1 pattern=$2 help=$3 out="$log_dir/$(echo "$1" | tr -c 'a-z0-9\n' '-')"
  shift 4
  if ! $help 2>&1 | grep -q -- "$pattern"; then
    record "NOT BUILT YET" "$name" "issue 16 item 6: not implemented"
  elif "$@" >"$out.json" 2>"$out.err"; then
    record PASS "$name" "$out.json"
  else
    record FAIL "$name" "see $out.err"
  fi
}
bench="$build/benchmarks/zero-bench"
optional "zero-bench kernels --device cuda" --device "$bench kernels --help" -- \
  "$bench" kernels --device cuda --json
optional "zero-bench comm --backend nccl" nccl "$bench comm --help" -- \
  "$bench" comm --backend nccl --json
optional "zero-bench step --device cuda" --device "$bench step --help" -- \
  "$bench" step --device cuda --json --world-size "$((gpus > 1 ? 2 : 1))" --params 64M
train="$build/tools/zero-train"
# The main job on the GPU, and again with the optimizer offloaded to the host (ZeRO-Offload).
for config in zero2_bf16_warmup zero2_offload_cpu; do
  if "$train" --device cuda --config "$root/examples/configs/$config.json" \
       --world-size "$((gpus > 0 ? gpus : 1))" --steps 50 >"$log_dir/main-job-$config.log" 2>&1; then
    record PASS "main job on the GPU ($config)" "$log_dir/main-job-$config.log"
  else
    record FAIL "main job on the GPU ($config)" "see $log_dir/main-job-$config.log"
  fi
done

echo "== gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null))"
printf '%s\n' "${summary[@]}"
exit $failed
