#!/usr/bin/env bash
# scripts/plot.sh FILE.jsonl [FILE.jsonl ...] OUT.png: zero-train --json / zero-bench --json output
# as one picture (scripts/plot.py says which panels). Runs matplotlib from the project's venv
# (.venv, or $VENV), creating the venv and installing matplotlib into it on first use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
py=$venv/bin/python

if [ $# -lt 2 ]; then
  "${PYTHON:-python3}" "$root/scripts/plot.py" --help >&2 || true
  exit 2
fi
if [ ! -x "$py" ]; then
  echo "plot: creating $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "plot: installing matplotlib into $venv" >&2
  "$py" -m pip install -q "matplotlib>=3.6"  # the version python/requirements-test.txt asks for
fi
exec "$py" "$root/scripts/plot.py" "$@"
