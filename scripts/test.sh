#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test through ctest,
# then the Python package's tests (python/tests, pytest) in .venv (scripts/python-env.sh).
# Tests that need a GPU exit 77 and are reported as skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
ctest --test-dir "${BUILD_DIR:-$root/build}" --output-on-failure -j 2
bash "$root/scripts/python-env.sh"
cd "$root"
"${VENV:-$root/.venv}/bin/python" -m pytest python/tests -q
