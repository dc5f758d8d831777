#!/usr/bin/env bash
# Installs what zero needs to build and test on Debian 12, as root (or through sudo).
# Required: a C++20 compiler, CMake >= 3.25, Ninja, nlohmann/json, fmt, Catch2 2.13, xxHash, libzip,
# yaml-cpp, oneDNN (the model's matrix products, fp32 and bf16; its CMake package asks for the
# OpenCL headers of its GPU runtime, which zero does not use).
# Optional and detected at configure time: OpenMPI (CPU multi-process ranks), liburing (NVMe),
# the CUDA toolkit (not from Debian; used when nvcc is on PATH).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config
          nlohmann-json3-dev libfmt-dev catch2 libxxhash-dev libzip-dev libyaml-cpp-dev
          libdnnl-dev ocl-icd-opencl-dev
          libopenmpi-dev openmpi-bin liburing-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root, or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
