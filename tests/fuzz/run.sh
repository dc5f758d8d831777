#!/usr/bin/env bash
# Builds the ds_config fuzzer with clang (ASan + UBSan + libFuzzer) and runs it for SECONDS
# (default 300), seeded with every config in tests/data. Findings are written to BUILD/fuzz-findings.
#   tests/fuzz/run.sh [SECONDS]          BUILD defaults to <repo>/build-fuzz (ZERO_FUZZ_BUILD)
set -euo pipefail
seconds=${1:-300}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ZERO_FUZZ_BUILD:-$root/build-fuzz}
cxx=$(command -v clang++-14 || command -v clang++)
cc=$(command -v clang-14 || command -v clang)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DZERO_FUZZ=ON -DZERO_WITH_CUDA=OFF >/dev/null
cmake --build "$build" --target config_fuzz
corpus="$build/fuzz-corpus"
findings="$build/fuzz-findings"
mkdir -p "$corpus" "$findings"
find "$root/tests/data/corpus" "$root/tests/data/configs" -name '*.json' -exec cp {} "$corpus/" \;
exec "$build/tests/fuzz/config_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=8192 -dict="$root/tests/fuzz/config.dict" -artifact_prefix="$findings/" \
  -print_final_stats=1 "$corpus"
