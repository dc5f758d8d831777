#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test through ctest.
# Tests that need a GPU exit 77 and are reported as skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
ctest --test-dir "${BUILD_DIR:-$root/build}" --output-on-failure -j 2
