#!/usr/bin/env bash
# What has to pass on a GPU machine before zero may claim anything about GPUs (issues 16 and 31),
# in one go from a clean copy of the tree, on a machine without network:
#   1. the offline dependencies: scripts/install-deps.sh --from $ZERO_OFFLINE_DEPS (default
#      .offline-deps, made by install-deps.sh --download), when that folder exists;
#   2. configure with CUDA required (-DZERO_WITH_CUDA=ON -DZERO_WITH_MPI=OFF, Release, Ninja,
#      CUDA_ARCHS or 90) and build only what runs below (the target gpu-check-targets);
#   3. every test labelled gpu, one at a time — a skip (exit 77) is a FAILURE here;
#   4. python/tests/gpu with pytest against the built libzero.so, where that folder exists;
#   5. zero-bench kernels --device cuda, zero-bench step --device cuda --params 64M, the same
#      with examples/configs/zero2_offload_cpu.json (PCIe copies), zero-bench offload (the host's
#      AdamW against its traffic probe);
#   6. zero-train --device cuda with examples/configs/zero2_bf16_warmup.json and
#      zero2_offload_cpu.json;
#   7. benchmarks/peers/cuda_train_peers.py: zero.initialize at stages 0-3 against plain PyTorch
#      (fused AdamW, autocast bf16) and a bare forward+backward, training the same 110M-parameter
#      GPT on this GPU, and stage 3 again with its gathers waited for by the host
#      (zero-s3-hostwait, the comparison for the stream-ordered gathers); PASS when every peer ran
#      and the losses agree;
#   8. benchmarks/peers/cuda_optimizer_peers.py: zero's AdamW (64M and 1G parameters in 100
#      tensors) against its traffic probe and torch.optim.AdamW(fused=True) on this GPU, and
#      DeepSpeed's FusedAdam where the offline set carries DeepSpeed (for context: its extension
#      builds here at first use, and a failure is only reported); PASS only when it exits 0 (every
#      target met), NOT RUN where python3 has no torch.
# Every part runs and is reported even when an earlier one failed (only a failed configure stops
# the rest); each has a time limit, and none starts after the overall budget is spent. A part is
# PASS only when it ran and passed; what could not run (a flag a command does not have yet, a
# missing folder, no time left) is NOT RUN with the reason. Results go to $GPU_CHECK_OUT:
# summary.json (commit, date, GPU, toolchain, each part's status, seconds, detail and files),
# summary.txt, each command's stdout (JSON where it prints JSON) and stderr apart, configure.log,
# build.log, ctest-gpu.log and nvidia-smi.txt. Exits 1 when a part failed.
#
#   scripts/gpu-check.sh [extra CMake arguments]
#   BUILD_DIR=build-gpu               GPU_CHECK_OUT=$BUILD_DIR/gpu-check
#   GPU_CHECK_TAR=FILE                also pack $GPU_CHECK_OUT into FILE (.tar.gz) at the end
#   CUDA_ARCHS=90                     ZERO_OFFLINE_DEPS=.offline-deps
#   GPU_CHECK_BUDGET=420              seconds for everything; a part is cut short or NOT RUN
#                                     where it would end later, so the summary is written within it
#   GPU_CHECK_PART_TIMEOUT=120        seconds per test, benchmark or training run
#   GPU_CHECK_BUILD_TIMEOUT=300       seconds for the build
#   GPU_CHECK_PYTEST_TIMEOUT=240      seconds for the Python checks
#   GPU_CHECK_PEERS_TIMEOUT=270       seconds for the torch comparison (part 8; DeepSpeed's peer
#                                     gets what is left after the first 60)
#   GPU_CHECK_TRAIN_PEERS_TIMEOUT=150 seconds for the training comparison (part 7)
#   ZERO_COMMIT=SHA                   the commit the tree is (before git's answer: a copied tree may
#                                     carry an older .git; else the first line of a COMMIT file)
#   GPU_CHECK_PYTHON_TESTS=python/tests/gpu   the pytest folder
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build-gpu}")
out=$(realpath -m "${GPU_CHECK_OUT:-$build/gpu-check}")
offline=${ZERO_OFFLINE_DEPS:-$root/.offline-deps}
archs=${CUDA_ARCHS:-90}
part_timeout=${GPU_CHECK_PART_TIMEOUT:-120}
build_timeout=${GPU_CHECK_BUILD_TIMEOUT:-300}
pytest_timeout=${GPU_CHECK_PYTEST_TIMEOUT:-240}
peers_timeout=${GPU_CHECK_PEERS_TIMEOUT:-270}
train_peers_timeout=${GPU_CHECK_TRAIN_PEERS_TIMEOUT:-150}
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_BUDGET:-420}))

if [ -e "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/parts.tsv" ]; then
  echo "gpu-check: $out is not empty and is no earlier gpu-check output; not writing there" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
parts=$out/parts.tsv
: >"$parts"

# record NAME STATUS SECONDS DETAIL [FILE...]: one part's result (files relative to $out).
record() {
  local name=$1 status=$2 seconds=$3 detail=$4
  shift 4
  local files
  files=$(IFS=,; echo "$*")
  detail=$(printf '%s' "$detail" | tr '\t\n\r' '   ' | cut -c1-400)
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$detail" "$files" >>"$parts"
  printf 'gpu-check: %-8s %s: %s\n' "$status" "$name" "$detail"
}

# limit_for SECONDS: SECONDS, or less so that the part ends before the budget (20 s kept for the
# summary); 0 when under 10 s would be left.
limit_for() {
  local left=$((deadline - $(date +%s) - 20))
  if [ "$left" -lt 10 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# run_timed LIMIT STDOUT STDERR CMD...: runs CMD (stdin closed) under timeout, STDERR "-" joins it
# to STDOUT; sets rc and seconds. A LIMIT of 0 runs nothing (rc 254: no time left).
run_timed() {
  local limit=$1 stdout=$2 stderr=$3 t0
  shift 3
  if [ "$limit" -le 0 ]; then
    : >"$stdout"
    rc=254
    seconds=0
    return
  fi
  t0=$(date +%s.%N)
  if [ "$stderr" = - ]; then
    timeout --kill-after=10 "$limit" "$@" </dev/null >"$stdout" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" </dev/null >"$stdout" 2>"$stderr"
  fi
  rc=$?
  seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}

# Why a command failed, in one line: a timeout, a flag it does not have, or its last words.
failure_detail() {  # RC LIMIT STDERR-FILE
  if [ "$1" -eq 254 ]; then
    echo "not started: no time left in the budget"
  elif [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
    echo "timed out after $2 s"
  else
    echo "exit $1: $(grep -v '^[[:space:]]*$' "$3" | tail -n 1 | cut -c1-300)"
  fi
}

# The flag a command refused, when that is why it failed (zero-bench: "unexpected argument
# '--x'", zero-train: "unknown option '--x'").
refused_flag() {  # STDERR-FILE
  grep -oE "(unexpected argument|unknown option|unrecognized option) '--[a-z0-9-]+" "$1" |
    head -n 1 | sed "s/.*'//"
}

# JSON records on a command's stdout: "N JSON records[, M other lines]"; N is 0 when none.
json_records() {  # FILE
  python3 - "$1" <<'EOF'
import json, sys
records = other = 0
for line in open(sys.argv[1], errors="replace"):
    if not line.strip():
        continue
    try:
        json.loads(line)
        records += 1
    except ValueError:
        other += 1
print(f"{records} JSON records" + (f", {other} other lines" if other else ""))
EOF
}

# --- the machine ---------------------------------------------------------------------------------
gpus=0
gpu_line=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
             head -n 1)
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ "$gpus" -gt 0 ]; then
  record "GPU visible (nvidia-smi)" PASS 0 "$gpus GPU(s): $gpu_line" nvidia-smi.txt
else
  echo "nvidia-smi: $(command -v nvidia-smi || echo 'not on PATH')" >>"$out/nvidia-smi.txt"
  record "GPU visible (nvidia-smi)" FAIL 0 "nvidia-smi finds no GPU" nvidia-smi.txt
fi

# --- offline dependencies ------------------------------------------------------------------------
offline_used=""
if [ -d "$offline" ]; then
  run_timed "$(limit_for 120)" "$out/offline-deps.log" - bash "$root/scripts/install-deps.sh" --from "$offline"
  if [ $rc -eq 0 ] && [ -f "$offline/root/env.sh" ]; then
    # shellcheck disable=SC1091
    . "$offline/root/env.sh"
    offline_used="$offline ($(wc -l <"$offline/packages.txt" 2>/dev/null || echo '?') packages)"
    record "offline dependencies" PASS "$seconds" "unpacked into $offline/root" offline-deps.log
  else
    record "offline dependencies" FAIL "$seconds" \
      "$(failure_detail $rc 120 "$out/offline-deps.log"); configuring with the system's packages" \
      offline-deps.log
  fi
else
  record "offline dependencies" "NOT RUN" 0 "no $offline: configuring with the system's packages"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# --- the commit and the toolchain ----------------------------------------------------------------
commit=unknown
commit_source=unknown
# ZERO_COMMIT first: a copy of the tree may carry a .git older than its files.
if [ -n "${ZERO_COMMIT:-}" ]; then
  commit=$ZERO_COMMIT
  commit_source=ZERO_COMMIT
elif [ "$(git -C "$root" rev-parse --show-toplevel 2>/dev/null)" = "$root" ]; then
  commit=$(git -C "$root" rev-parse HEAD)
  commit_source=git
  [ -z "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
    commit_source="git, with uncommitted changes"
elif [ -f "$root/COMMIT" ]; then
  commit=$(head -n 1 "$root/COMMIT")
  commit_source="COMMIT file"
fi
if command -v ninja >/dev/null; then
  generator=Ninja
  keep_going=(-k 0)
else
  generator="Unix Makefiles"
  keep_going=(-k)
fi
nvcc_version=$(nvcc --version 2>/dev/null | grep -o 'release .*' || echo "nvcc not found")
cmake_version=$(cmake --version 2>/dev/null | head -n 1 || echo "cmake not found")

summarise() {
  local cxx
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  GPU_CHECK_COMMIT=$commit GPU_CHECK_COMMIT_SOURCE=$commit_source \
  GPU_CHECK_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) GPU_CHECK_SECONDS=$(($(date +%s) - started)) \
  GPU_CHECK_GPU=$gpu_line GPU_CHECK_NVCC="nvcc $nvcc_version" \
  GPU_CHECK_COMPILER="$("${cxx:-c++}" --version 2>/dev/null | head -n 1 || echo 'no C++ compiler')" \
  GPU_CHECK_CMAKE="$cmake_version" GPU_CHECK_GENERATOR="$generator" GPU_CHECK_CUDA_ARCHS="$archs" \
  GPU_CHECK_OFFLINE_DEPS="$offline_used" \
    python3 "$root/scripts/gpu_check_summary.py" "$out" "$parts"
  local status=$?
  if [ $status -ne 0 ] && [ $status -ne 1 ]; then  # no python3, or the summary itself failed
    echo "gpu-check: no summary.json (python3 exited $status); the parts:"
    cat "$parts"
    status=1
  fi
  if [ -n "${GPU_CHECK_TAR:-}" ]; then
    tar -czf "$GPU_CHECK_TAR" -C "$(dirname "$out")" "$(basename "$out")" &&
      echo "gpu-check: packed into $GPU_CHECK_TAR"
  fi
  exit $status
}

peers_part="AdamW against torch fused (peers/cuda_optimizer_peers.py)"
train_peers_part="training against torch on the GPU (peers/cuda_train_peers.py)"
planned_parts=("build (gpu-check-targets)" "gpu tests (ctest -L gpu)" "python tests (python/tests/gpu)"
               "zero-bench kernels --device cuda" "zero-bench step --device cuda"
               "zero-bench step --device cuda (zero2_offload_cpu)" "zero-bench offload (host CPU Adam)"
               "zero-train --device cuda (zero2_bf16_warmup)" "zero-train --device cuda (zero2_offload_cpu)"
               "zero-train --device cuda --world-size 2 on GPU 0 (zero2_bf16_warmup)"
               "$train_peers_part" "$peers_part")

# --- configure -----------------------------------------------------------------------------------
cmake_args=(-S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release
            -DZERO_WITH_CUDA=ON -DZERO_WITH_MPI=OFF "-DCMAKE_CUDA_ARCHITECTURES=$archs" "$@")
limit=$(limit_for 300)
run_timed "$limit" "$out/configure.log" - cmake "${cmake_args[@]}"
if [ $rc -ne 0 ]; then
  cmake_error=$(grep -m 1 -A 3 'CMake Error' "$out/configure.log" | tr -s ' \n' ' ')
  record "configure (ZERO_WITH_CUDA=ON)" FAIL "$seconds" \
    "$(failure_detail $rc "$limit" "$out/configure.log")${cmake_error:+ ($cmake_error)}" configure.log
  for p in "${planned_parts[@]}"; do record "$p" "NOT RUN" 0 "configure failed"; done
  summarise
fi
record "configure (ZERO_WITH_CUDA=ON)" PASS "$seconds" \
  "$(grep -E '^-- +[✓✗] ' "$out/configure.log" | sed 's/^-- *//' | tr -s ' ' | paste -sd ';')" \
  configure.log

# --- build only what runs ------------------------------------------------------------------------
mapfile -t gpu_tests < <(ctest --test-dir "$build" -N -L gpu --show-only=json-v1 2>/dev/null |
  python3 -c 'import json, sys; print("\n".join(t["name"] for t in json.load(sys.stdin)["tests"]))')
limit=$(limit_for "$build_timeout")
run_timed "$limit" "$out/build.log" - \
  cmake --build "$build" -j "$(nproc)" --target gpu-check-targets -- "${keep_going[@]}"
build_rc=$rc
if [ "$(stat -c %s "$out/build.log")" -gt $((4 << 20)) ]; then  # keep it fetchable
  { head -n 300 "$out/build.log"; echo "[... trimmed: the errors, then the end ...]"
    grep -E 'FAILED:|error' "$out/build.log" | head -n 300; tail -n 1500 "$out/build.log"; } \
    >"$out/build.trimmed" && mv "$out/build.trimmed" "$out/build.log"
fi
# built TARGET: whether TARGET is up to date after the build. Without Ninja (it is in the offline
# dependencies) there is no cheap way to ask, and only a build that passed as a whole counts.
built() {
  if [ "$generator" = Ninja ]; then
    cmake --build "$build" --target "$1" -- -n 2>/dev/null | grep -q 'no work to do'
  else
    [ "$build_rc" -eq 0 ]
  fi
}
failed_targets=()
for t in zero-bench zero-train zero_shared "${gpu_tests[@]}"; do
  built "$t" || failed_targets+=("$t")
done
if [ $build_rc -eq 0 ] && [ ${#failed_targets[@]} -eq 0 ]; then
  record "build (gpu-check-targets)" PASS "$seconds" \
    "zero-bench, zero-train, libzero.so and ${#gpu_tests[@]} gpu tests" build.log
else
  first_error=$(grep -m 1 -E '^FAILED:|error:' "$out/build.log" | cut -c1-200)
  record "build (gpu-check-targets)" FAIL "$seconds" \
    "$(failure_detail $build_rc "$limit" /dev/null | sed 's/: $//'); not built: ${failed_targets[*]:-none}; first error: ${first_error:-none}" \
    build.log
fi

# --- gpu tests, one at a time: every one must run, none may skip --------------------------------
if [ ${#gpu_tests[@]} -eq 0 ]; then
  record "gpu tests (ctest -L gpu)" FAIL 0 "no test carries the gpu label"
fi
: >"$out/ctest-gpu.log"
for t in "${gpu_tests[@]}"; do
  name="gpu test $t"
  if ! built "$t"; then record "$name" FAIL 0 "not built (see build.log)"; continue; fi
  limit=$(limit_for "$part_timeout")
  if [ "$limit" -eq 0 ]; then record "$name" "NOT RUN" 0 "no time left in the budget"; continue; fi
  run_timed "$limit" "$out/ctest-one.log" - ctest --test-dir "$build" -R "^$t\$" -V --no-tests=error
  { echo "=== $t (exit $rc, $seconds s)"; cat "$out/ctest-one.log"; } >>"$out/ctest-gpu.log"
  result=$(grep -E "Test +#[0-9]+: $t \.+" "$out/ctest-one.log" | tail -n 1 |
           sed -E "s/.*Test +#[0-9]+: $t \.+ *//")
  # The test's own last word: Catch2's totals, or why it skipped.
  said=$(grep -E '^[0-9]+: ' "$out/ctest-one.log" |
         grep -vE '^[0-9]+: (Test command|Working Directory|Environment variables|Test timeout|$)' |
         grep -vE '^[0-9]+: [= -]*$' | tail -n 1 | sed -E 's/^[0-9]+: //' | cut -c1-200)
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL "$seconds" "timed out after $limit s" ctest-gpu.log
  elif [[ $result == *Skipped* ]]; then
    record "$name" FAIL "$seconds" "skipped (exit 77) on a GPU machine: $said" ctest-gpu.log
  elif [ $rc -eq 0 ] && [[ $result == Passed* ]]; then
    record "$name" PASS "$seconds" "$said" ctest-gpu.log
  else
    record "$name" FAIL "$seconds" "${result:-no result (exit $rc)}: $said" ctest-gpu.log
  fi
done
rm -f "$out/ctest-one.log"

# tool_part: how a benchmark or training run on the GPU is run and judged ------------------------
# tool_part NAME FILE-BASE TARGET EXECUTABLE ARGS...: stdout in BASE.json, stderr in BASE.err.
tool_part() {
  local name=$1 base=$2 target=$3
  shift 3
  if ! built "$target"; then record "$name" FAIL 0 "$target not built (see build.log)"; return; fi
  local limit flag
  limit=$(limit_for "$part_timeout")
  if [ "$limit" -eq 0 ]; then record "$name" "NOT RUN" 0 "no time left in the budget"; return; fi
  run_timed "$limit" "$out/$base.json" "$out/$base.err" "$@"
  if [ $rc -eq 0 ]; then
    local records
    records=$(json_records "$out/$base.json")
    if [[ $records == "0 JSON records"* ]]; then
      record "$name" FAIL "$seconds" "exit 0 but no JSON on stdout ($records)" "$base.json" "$base.err"
    else
      record "$name" PASS "$seconds" "$records" "$base.json" "$base.err"
    fi
  elif flag=$(refused_flag "$out/$base.err") && [ -n "$flag" ] && [ $rc -ne 124 ]; then
    record "$name" "NOT RUN" "$seconds" "$target does not take $flag yet: $(failure_detail $rc "$limit" "$out/$base.err")" \
      "$base.err"
  else
    record "$name" FAIL "$seconds" "$(failure_detail $rc "$limit" "$out/$base.err")" "$base.json" "$base.err"
  fi
}
# --- Python checks ---------------------------------------------------------------------------------
python_tests=${GPU_CHECK_PYTHON_TESTS:-$root/python/tests/gpu}
name="python tests (python/tests/gpu)"
library=$build/libzero.so
if [ ! -d "$python_tests" ]; then
  record "$name" "NOT RUN" 0 "$python_tests not present"
elif ! python3 -c 'import pytest' 2>/dev/null; then
  record "$name" "NOT RUN" 0 "python3 has no pytest (nor has $offline/root/python)"
elif ! built zero_shared; then
  record "$name" FAIL 0 "libzero.so not built (see build.log)"
elif [ "$(limit_for "$pytest_timeout")" -eq 0 ]; then
  record "$name" "NOT RUN" 0 "no time left in the budget"
else
  limit=$(limit_for "$pytest_timeout")
  # GPU_CHECK_OUT: where the tests may leave figures of their own (python-*.json).
  run_timed "$limit" "$out/pytest-gpu.log" - env -C "$root" ZERO_LIBRARY="$library" \
    GPU_CHECK_OUT="$out" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m pytest "$python_tests" -q -p no:cacheprovider --junitxml="$out/pytest-gpu.xml"
  counts=$(python3 - "$out/pytest-gpu.xml" <<'EOF' 2>/dev/null
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(" ".join(str(total[k]) for k in ("tests", "failures", "errors", "skipped")))
EOF
  )
  read -r tests failures errors skipped <<<"${counts:-0 0 0 0}"
  said="$tests tests, $failures failed, $errors errors, $skipped skipped"
  files=(pytest-gpu.log)
  for f in "$out"/pytest-gpu.xml "$out"/python-*.json; do [ -f "$f" ] && files+=("$(basename "$f")"); done
  if [ $rc -eq 5 ]; then  # pytest: no tests collected
    record "$name" "NOT RUN" "$seconds" "pytest collected no tests" "${files[@]}"
  elif [ $rc -ne 0 ] && [ $rc -ne 1 ]; then  # a timeout, or pytest could not run the tests
    record "$name" FAIL "$seconds" "$(failure_detail $rc "$limit" "$out/pytest-gpu.log")" "${files[@]}"
  elif [ "$skipped" -gt 0 ]; then
    record "$name" FAIL "$seconds" "skipped on a GPU machine: $said" "${files[@]}"
  elif [ $rc -eq 0 ] && [ "$tests" -gt 0 ]; then
    record "$name" PASS "$seconds" "$said" "${files[@]}"
  else
    record "$name" FAIL "$seconds" "exit $rc: $said" "${files[@]}"
  fi
fi

# --- benchmarks and training (after the Python checks: those find more per second) -----------
bench=$build/benchmarks/zero-bench
train=$build/tools/zero-train
tool_part "zero-bench kernels --device cuda" bench-kernels zero-bench \
  "$bench" kernels --device cuda --json
tool_part "zero-bench step --device cuda" bench-step zero-bench \
  "$bench" step --device cuda --json --world-size 1 --params 64M
# ZeRO-Offload over PCIe: the landed gradients' and uploaded parameters' copies next to pinned
# copies of the same size ("offload" in each record), and the host's AdamW on this machine's cores
# against its traffic probe.
tool_part "zero-bench step --device cuda (zero2_offload_cpu)" bench-step-offload zero-bench \
  "$bench" step --device cuda --json --world-size 1 --params 64M --stages 2 --precision bf16 \
  --config "$root/examples/configs/zero2_offload_cpu.json"
mkdir -p "$build/offload-nvme"
tool_part "zero-bench offload (host CPU Adam)" bench-offload zero-bench \
  "$bench" offload --json --elems 64M --repeats 5 --nvme-path "$build/offload-nvme"
for config in zero2_bf16_warmup zero2_offload_cpu; do
  tool_part "zero-train --device cuda ($config)" "train-$config" zero-train \
    "$train" --device cuda --config "$root/examples/configs/$config.json" \
    --world-size "$((gpus > 0 ? gpus : 1))" --steps 50 --json
done
# Two in-process ranks sharing GPU 0 (DeviceInProcComm: NCCL refuses two ranks on one GPU).
tool_part "zero-train --device cuda --world-size 2 on GPU 0 (zero2_bf16_warmup)" train-two-ranks \
  zero-train "$train" --device cuda --config "$root/examples/configs/zero2_bf16_warmup.json" \
  --world-size 2 --steps 50 --json

# torch_part_runs NAME TARGET FILE TIMEOUT: whether a part that runs a torch script can run
# (TARGET, whose file is FILE, built; python3 with torch; time left); records why not when not.
torch_part_runs() {
  if ! built "$2"; then
    record "$1" FAIL 0 "$3 not built (see build.log)"
  elif ! python3 -c 'import torch' 2>/dev/null; then
    record "$1" "NOT RUN" 0 "python3 has no torch (nor has $offline/root/python)"
  elif [ "$(limit_for "$4")" -eq 0 ]; then
    record "$1" "NOT RUN" 0 "no time left in the budget"
  else
    return 0
  fi
  return 1
}

# --- zero.initialize against plain PyTorch training the same transformer on this GPU ----------
name=$train_peers_part
if torch_part_runs "$name" zero_shared libzero.so "$train_peers_timeout"; then
  limit=$(limit_for "$train_peers_timeout")
  run_timed "$limit" "$out/peers-cuda-train.log" - env -C "$root" ZERO_LIBRARY="$library" \
    PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" python3 \
    "$root/benchmarks/peers/cuda_train_peers.py" --json "$out/peers-cuda-train.json"
  files=(peers-cuda-train.log)
  [ -f "$out/peers-cuda-train.json" ] && files+=(peers-cuda-train.json)
  if [ $rc -eq 0 ]; then
    record "$name" PASS "$seconds" "$(grep -E '^\| zero-s' "$out/peers-cuda-train.log" |
      awk -F'|' '{gsub(/ /, "", $2); gsub(/ /, "", $9); printf "%s %sx torch; ", $2, $9}')" \
      "${files[@]}"
  else
    record "$name" FAIL "$seconds" \
      "$(failure_detail $rc "$limit" "$out/peers-cuda-train.log")" "${files[@]}"
  fi
fi

# --- zero's AdamW against torch's fused AdamW on the same GPU (issue 31 item 4) ---------------
# Last: it needs zero-bench and torch, and a run cut short by the budget has no figures.
name=$peers_part
if torch_part_runs "$name" zero-bench zero-bench "$peers_timeout"; then
  limit=$(limit_for "$peers_timeout")
  # DeepSpeed's FusedAdam beside them where the offline set carries DeepSpeed (its extension is
  # compiled at first use, under what the part has left after zero's and torch's figures, about
  # 40 s on an H200); only the peers see $offline/root/peers-python.
  peers_python=$offline/root/peers-python
  [ -d "$peers_python" ] || peers_python=
  ds_args=(--deepspeed off)
  [ $((limit - 60)) -ge 60 ] && ds_args=(--deepspeed auto --deepspeed-timeout $((limit - 60)))
  run_timed "$limit" "$out/peers-cuda-optimizer.log" - env \
    PYTHONPATH="${peers_python}${peers_python:+${PYTHONPATH:+:}}${PYTHONPATH:-}" \
    TORCH_EXTENSIONS_DIR="$build/torch-extensions" MAX_JOBS="$(nproc)" python3 \
    "$root/benchmarks/peers/cuda_optimizer_peers.py" --zero-bench "$bench" "${ds_args[@]}" \
    --json "$out/peers-cuda-optimizer.json"
  files=(peers-cuda-optimizer.log)
  [ -f "$out/peers-cuda-optimizer.json" ] && files+=(peers-cuda-optimizer.json)
  said=$(grep -E '^targets: ' "$out/peers-cuda-optimizer.log" | tail -n 1)
  ds_said=$(grep -E '^DeepSpeed FusedAdam: ' "$out/peers-cuda-optimizer.log" | tail -n 1 | cut -c1-160)
  [ -n "$said" ] && [ -n "$ds_said" ] && said="$said; $ds_said"
  if [ $rc -eq 0 ]; then
    record "$name" PASS "$seconds" "$said" "${files[@]}"
  elif [ $rc -eq 1 ] && [ -n "$said" ]; then
    record "$name" FAIL "$seconds" "$said" "${files[@]}"
  else
    record "$name" FAIL "$seconds" \
      "$(failure_detail $rc "$limit" "$out/peers-cuda-optimizer.log")" "${files[@]}"
  fi
fi

summarise
