#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, checks the bundled ds_configs the way
# the runtime reads them, then trains the default MLP with ZeRO stage 2 (bf16, AdamW, WarmupLR) on
# 2 in-process ranks for 50 steps and prints loss per step and each rank's memory next to the
# ZeRO paper's formula.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" >/dev/null
cd "$root"

echo "== zero-config check --world-size 2 examples/configs/*.json"
"$build/tools/zero-config" check --world-size 2 examples/configs/*.json
echo
echo "== zero-train --config examples/configs/zero2_bf16_warmup.json --world-size 2 --steps 50"
"$build/tools/zero-train" --config examples/configs/zero2_bf16_warmup.json --world-size 2 --steps 50
