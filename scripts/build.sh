#!/usr/bin/env bash
# Configures and builds zero into ${BUILD_DIR:-build}. Extra arguments go to CMake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
# nvcc lives outside PATH in the toolkit's default install; CUDA sources build when it is there.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_WERROR=ON "$@"
cmake --build "$build" -j "$(nproc)"
