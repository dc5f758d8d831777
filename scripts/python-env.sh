#!/usr/bin/env bash
# Makes .venv at the repo root hold what the Python tests need: python/requirements-test.txt
# (torch, safetensors, numpy, pytest, transformers, accelerate, deepspeed; minimum versions) and the zero package (pip install ./python,
# which builds libzero.so through CMake in ${BUILD_DIR:-build}). Idempotent: requirements already
# satisfied are not reinstalled, and the package is reinstalled only when the sources changed
# since the last install (a hash of its sources, kept in .venv).
# Environment: PYTHON (default python3) creates the venv; VENV (default .venv) is where.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
py=$venv/bin/python
req=$root/python/requirements-test.txt
say() { echo "python-env: $*"; }

if [ ! -x "$py" ]; then
  base=${PYTHON:-python3}
  # Debian splits venv and pip out of python3 (python3-venv, python3-pip).
  if ! command -v "$base" >/dev/null || ! "$base" -c 'import venv, ensurepip' 2>/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo >/dev/null || { echo "python-env: run as root, or install sudo" >&2; exit 1; }
      sudo="sudo"
    fi
    say "installing python3 python3-venv python3-pip"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip
    base=python3
  fi
  say "creating $venv with $("$base" --version 2>&1)"
  "$base" -m venv "$venv"
fi

# Lists the requirements the venv does not satisfy (pip's own copy of `packaging` reads them).
unmet=$("$py" - "$req" <<'EOF'
import sys
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    r = Requirement(line)
    try:
        have = metadata.version(r.name)
    except metadata.PackageNotFoundError:
        print(f"{r.name} (not installed)")
        continue
    if not r.specifier.contains(have, prereleases=True):
        print(f"{r.name} {have} (want {r.specifier})")
EOF
)
if [ -n "$unmet" ]; then
  say "installing requirements: $(echo $unmet)"
  # torch from PyPI brings its CUDA libraries (a few GB): allow for a few minutes.
  # DeepSpeed (a test dependency) builds from source: no ops ahead of time (it JIT-builds the one
  # its CPU runs need).
  DS_BUILD_OPS=0 "$py" -m pip install --progress-bar off -r "$req"
else
  have=$("$py" -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|safetensors|numpy|pytest)==' || true)
  say "requirements satisfied: $(echo $have)"
fi

# The package depends on python/ and on the C++ sources it builds; a hash of them (every file but
# tests, scripts and documents) says when a reinstall is due. Outside a git checkout there is no list of sources: always reinstall.
stamp=$venv/.zero-package-sources
sources=""
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  sources=$(cd "$root" && { git ls-files -co --exclude-standard -z -- . ':!python/tests' ':!tests' \
      ':!scripts' ':!docs' ':!examples' ':!benchmarks/*.py' ':!.ci' ':!*.md' \
      | xargs -0 sha1sum 2>/dev/null || true; } | sha1sum | cut -d' ' -f1)
fi
# (importlib.metadata, not `import zero`: that would import torch, seconds each time.)
installed=$("$py" -c 'from importlib import metadata; print(metadata.version("zero"))' 2>/dev/null || true)
if [ -n "$sources" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sources" ] && [ -n "$installed" ]; then
  say "zero package $installed up to date"
  exit 0
fi
rm -f "$stamp"
say "installing the zero package (pip install ./python)"
start=$(date +%s)
# setup.py builds libzero.so in ZERO_BUILD_DIR; the build scripts/build.sh made is reused.
(cd "$root" && ZERO_BUILD_DIR=${BUILD_DIR:-$root/build} "$py" -m pip install -q --progress-bar off ./python)
"$py" -c 'import zero' || { echo "python-env: the installed package does not import" >&2; exit 1; }
[ -z "$sources" ] || echo "$sources" >"$stamp"
say "zero package installed in $(( $(date +%s) - start )) s"
