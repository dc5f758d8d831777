#!/usr/bin/env bash
# Builds a fuzzer with clang (ASan + UBSan + libFuzzer) and runs it for SECONDS (default 300) on
# one core. Findings are written to BUILD/fuzz-findings.
#   tests/fuzz/run.sh [SECONDS] [TARGET]   BUILD defaults to <repo>/build-fuzz (ZERO_FUZZ_BUILD)
# TARGET: config_fuzz (default; seeded with every config in tests/data), pickle_fuzz (seeded with
# the fixtures' pickles, tests/fuzz/pickle_seeds), pt_archive_fuzz (seeded with the DeepSpeed
# fixture .pt files in tests/data/deepspeed_checkpoints) or checkpoint_fuzz (zero's safetensors
# headers and manifests, seeded with tests/fuzz/checkpoint_seeds).
set -euo pipefail
seconds=${1:-300}
target=${2:-config_fuzz}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${ZERO_FUZZ_BUILD:-$root/build-fuzz}
cxx=$(command -v clang++-14 || command -v clang++)
cc=$(command -v clang-14 || command -v clang)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DZERO_FUZZ=ON -DZERO_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j2 --target "$target"
findings="$build/fuzz-findings"
mkdir -p "$findings"
case "$target" in
  pickle_fuzz|pt_archive_fuzz)
    corpus="$build/fuzz-corpus-$target"
    mkdir -p "$corpus"
    if [ "$target" = pickle_fuzz ]; then
      cp "$root"/tests/fuzz/pickle_seeds/*.pkl "$corpus/"
      extra=(-max_len=4096 -dict="$root/tests/fuzz/pickle.dict")
    else
      # Odd first byte: the fixture archives as they are; even: their pickles with 12 KB of data.
      for f in $(find "$root/tests/data/deepspeed_checkpoints" -name '*.pt'); do
        { printf '\001'; cat "$f"; } > "$corpus/raw_$(echo "$f" | tr / _)"
      done
      for f in "$root"/tests/fuzz/pickle_seeds/*.pkl; do
        { printf '\000'; cat "$f"; printf 'ZSEP'; head -c 12288 /dev/zero | tr '\000' '\077'; } \
          > "$corpus/built_$(basename "$f")"
      done
      extra=(-max_len=65536)
    fi
    exec "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      "${extra[@]}" -artifact_prefix="$findings/$target-" \
      -print_final_stats=1 "$corpus"
    ;;
  checkpoint_fuzz)
    corpus="$build/fuzz-corpus-$target"
    mkdir -p "$corpus"
    cp "$root"/tests/fuzz/checkpoint_seeds/* "$corpus/"
    exec "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=16384 -artifact_prefix="$findings/$target-" -print_final_stats=1 "$corpus"
    ;;
  config_fuzz) ;;
  *) echo "run.sh: unknown target $target (config_fuzz, pickle_fuzz, pt_archive_fuzz, checkpoint_fuzz)" >&2; exit 2 ;;
esac
corpus="$build/fuzz-corpus"
mkdir -p "$corpus"
find "$root/tests/data/corpus" "$root/tests/data/configs" -name '*.json' -exec cp {} "$corpus/" \;
exec "$build/tests/fuzz/config_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=8192 -dict="$root/tests/fuzz/config.dict" -artifact_prefix="$findings/" \
  -print_final_stats=1 "$corpus"
