#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs the main job.
# Until the engine lands, the main job checks the bundled ds_configs the way the runtime will read
# them and prints the per-rank memory each one needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" >/dev/null
zc="$build/tools/zero-config"

echo "== zero-config check examples/configs/*.json"
"$zc" check --world-size 4 "$root"/examples/configs/*.json
echo
for cfg in "$root"/examples/configs/*.json; do
  echo "== zero-config estimate --params 1.3B --world-size 4 --config $(basename "$cfg")"
  "$zc" estimate --params 1.3B --largest-param 50M --world-size 4 --config "$cfg"
  echo
done
