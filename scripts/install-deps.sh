#!/usr/bin/env bash
# Installs what zero needs to build and test on Debian 12, as root (or through sudo).
# Required: a C++20 compiler, CMake >= 3.25, Ninja, nlohmann/json, fmt, Catch2 2.13, xxHash, libzip,
# yaml-cpp.
# Optional and detected at configure time: oneDNN (the model's matrix products, fp32 and bf16;
# without it they run on portable C++; its CMake package asks for the OpenCL headers of its GPU
# runtime, which zero does not use), OpenMPI (CPU multi-process ranks), liburing (NVMe), the CUDA
# toolkit (not from Debian; used when nvcc is on PATH).
#
#   scripts/install-deps.sh                 apt-get installs all of the above (what CI runs)
#   scripts/install-deps.sh --download DIR  on Debian 12 with apt: puts into DIR the .deb files a
#                                           CUDA build needs on a machine without network or
#                                           Debian's packages (the required libraries above, their
#                                           runtime libraries, ninja), pytest's wheels, and
#                                           DeepSpeed's with what it needs beyond the GPU
#                                           machine's Python (peer-wheels/: the FusedAdam peer
#                                           of benchmarks/peers/cuda_optimizer_peers.py)
#   scripts/install-deps.sh --from DIR [--prefix P]
#                                           on that machine: unpacks DIR's .deb files into P
#                                           (default DIR/root; never /), fixes what unpacking
#                                           outside / leaves pointing at /usr, and writes P/env.sh,
#                                           to be sourced before configuring (it exports
#                                           CMAKE_PREFIX_PATH, PKG_CONFIG_PATH, LD_LIBRARY_PATH);
#                                           peer-wheels/ unpack into P/peers-python, which only
#                                           the peer scripts put on PYTHONPATH
# The offline set leaves out oneDNN, OpenMPI and liburing: configure reports them as not found.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config
          nlohmann-json3-dev libfmt-dev catch2 libxxhash-dev libzip-dev libyaml-cpp-dev
          libdnnl-dev ocl-icd-opencl-dev
          libopenmpi-dev openmpi-bin liburing-dev)

# The offline set: headers, CMake packages and .pc files, the shared libraries they name; ninja
# and pkg-config (pkgconf), put on PATH only where the machine has none.
offline_packages=(nlohmann-json3-dev libfmt-dev libfmt9 catch2 libxxhash-dev libxxhash0
                  libzip-dev libzip4 libyaml-cpp-dev libyaml-cpp0.7 ninja-build
                  pkgconf pkgconf-bin libpkgconf3)
offline_tools=(ninja pkg-config)
# What libzip.so.4 loads that a base Debian or Ubuntu system usually has already: unpacked apart
# and put on the loader's path only for the sonames the system lacks, so the system's own copies
# (newer, and shared with everything else on it) win wherever they exist.
offline_fallback_packages=(libssl3 zlib1g libbz2-1.0)
offline_fallback_sonames=(libssl.so.3 libcrypto.so.3 libz.so.1 libbz2.so.1.0)
# Depends of the offline set that the machine provides (the C and C++ runtimes, the toolchain) or
# that the build does not need (libzip-dev asks for zlib1g-dev; zip.h does not include zlib.h).
offline_assumed=(libc6 libgcc-s1 libstdc++6 libc6-dev libc-dev zlib1g-dev)
# pytest for the Python checks of scripts/gpu-check.sh, as wheels for Python 3.12.
offline_wheels=(pytest)
# DeepSpeed for the GPU peers (its FusedAdam; the extension compiles there at first use), built
# here as a wheel (PyPI has only its source), and what it needs that the GPU machine's Python
# lacks; PEER_PYTHON (default: the repository's .venv, else python3) builds it.
peer_deepspeed=deepspeed==0.19.8
peer_wheels=(hjson pydantic)
offline_max_mib=48

usage() {
  sed -n '/^#   scripts/,/^# The offline set/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# download_peer_wheels DIR: DeepSpeed's wheel and its missing needs into DIR, or a message why not
# (the peer is optional: the GPU check reports it as not measured).
download_peer_wheels() {
  local dir=$1 python=${PEER_PYTHON:-}
  rm -rf "$dir"
  if [ -z "$python" ]; then
    python=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
    [ -x "$python" ] || python=python3
  fi
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    echo "install-deps: no pip for $python; the offline set has no DeepSpeed (its peer is not measured there)"
    return 0
  fi
  mkdir -p "$dir"
  if ! DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation "$peer_deepspeed" \
         -w "$dir" >/dev/null 2>&1 ||
     ! "$python" -m pip download -q --only-binary=:all: --python-version 3.12 \
         --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
         --platform any --dest "$dir" "${peer_wheels[@]}" >/dev/null 2>&1; then
    echo "install-deps: could not build or download $peer_deepspeed ${peer_wheels[*]}; the offline set has no DeepSpeed"
    rm -rf "$dir"
    return 0
  fi
  # The GPU machine's Python has typing_extensions (torch needs it): keep its own.
  rm -f "$dir"/typing_extensions-*.whl
}

download() {
  local dir=$1
  command -v apt-get >/dev/null || { echo "install-deps: --download needs apt-get" >&2; exit 1; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  rm -f "$dir"/*.deb "$dir"/packages.txt
  rm -rf "$dir/wheels"
  # What --from unpacked here before is made from the old files.
  if [ -f "$dir/root/.zero-offline-prefix" ]; then rm -rf "$dir/root"; fi
  local all=("${offline_packages[@]}" "${offline_fallback_packages[@]}")
  # apt's download sandbox user cannot write to root's folders; the files are only unpacked later.
  if ! (cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "${all[@]}"); then
    echo "install-deps: apt-get download failed; updating the package lists and retrying"
    apt-get update -qq
    (cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "${all[@]}")
  fi
  local deb name missing=()
  for deb in "$dir"/*.deb; do  # PACKAGE.deb: plain names, whatever the version holds (1:1.2.13)
    name=$(dpkg-deb -f "$deb" Package)
    [ "$deb" = "$dir/$name.deb" ] || mv "$deb" "$dir/$name.deb"
  done
  for deb in "$dir"/*.deb; do
    dpkg-deb -W --showformat='${Package} ${Version} ${Architecture}\n' "$deb" >>"$dir/packages.txt"
  done
  # Every dependency of the set is in the set or assumed present on the machine.
  for deb in "$dir"/*.deb; do
    for name in $(dpkg-deb -f "$deb" Depends | tr ',|' '\n\n' | sed 's/(.*//; s/:any//' |
                  tr -d ' ' | sort -u); do
      [[ " ${all[*]} ${offline_assumed[*]} " == *" $name "* ]] ||
        missing+=("$name (needed by $(basename "$deb"))")
    done
  done
  if [ ${#missing[@]} -gt 0 ]; then
    printf 'install-deps: not in the offline set: %s\n' "${missing[@]}" >&2
    exit 1
  fi
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --dest "$dir/wheels" \
      "${offline_wheels[@]}" ||
      echo "install-deps: pip could not download ${offline_wheels[*]}; the Python checks need pytest there"
  else
    echo "install-deps: no pip here; the offline set has no pytest"
  fi
  download_peer_wheels "$dir/peer-wheels"
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  echo "install-deps: $(ls "$dir"/*.deb | wc -l) packages$([ -d "$dir/wheels" ] &&
    echo " and $(ls "$dir"/wheels | wc -l) wheels")$([ -d "$dir/peer-wheels" ] &&
    echo " and $(ls "$dir"/peer-wheels | wc -l) peer wheels") in $dir: $((kib / 1024)) MiB ($kib KiB)"
  if [ "$kib" -gt $((offline_max_mib * 1024)) ]; then
    echo "install-deps: more than $offline_max_mib MiB: too large to carry" >&2
    exit 1
  fi
}

# Makes every absolute symbolic link under ROOT that points at a file unpacked under ROOT point at
# that file, relatively (dpkg -x keeps the links Debian ships, e.g. libz.so -> /lib/...).
relink_absolute() {
  local root=$1 link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    [[ $target == /* ]] || continue
    if [ -e "$root$target" ] || [ -L "$root$target" ]; then
      ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
    else
      echo "install-deps: $link points at $target, which is not unpacked; removed" >&2
      rm -f "$link"
    fi
  done < <(find "$root" -type l -print0)
}

from() {
  local dir=$1 prefix=$2
  dir=$(cd "$dir" && pwd)
  [ -n "$prefix" ] || prefix=$dir/root
  command -v dpkg-deb >/dev/null || { echo "install-deps: --from needs dpkg-deb" >&2; exit 1; }
  ls "$dir"/*.deb >/dev/null 2>&1 || { echo "install-deps: no .deb files in $dir" >&2; exit 1; }
  prefix=$(realpath -m "$prefix")
  if [ "$prefix" = / ] || [[ $prefix =~ ^/(usr|lib|lib64|bin|sbin|etc|opt)(/|$) ]]; then
    echo "install-deps: refusing to unpack into $prefix" >&2
    exit 1
  fi
  mkdir -p "$prefix"
  # A folder this script made before is replaced; any other non-empty folder is left alone.
  if [ -n "$(ls -A "$prefix")" ]; then
    [ -f "$prefix/.zero-offline-prefix" ] ||
      { echo "install-deps: $prefix is not empty and was not made by --from" >&2; exit 1; }
    rm -rf "${prefix:?}"/* "$prefix"/.zero-offline-prefix
  fi
  touch "$prefix/.zero-offline-prefix"

  local deb name
  for deb in "$dir"/*.deb; do
    name=$(dpkg-deb -f "$deb" Package)
    if [[ " ${offline_fallback_packages[*]} " == *" $name "* ]]; then
      dpkg -x "$deb" "$prefix/fallback"
    else
      dpkg -x "$deb" "$prefix"
    fi
  done
  relink_absolute "$prefix"
  [ -d "$prefix/fallback" ] && relink_absolute "$prefix/fallback"

  # .pc files name /usr (prefix=/usr, Cflags: -I/usr/include); CMake packages find their files
  # from their own location, except Debian's "/usr move" check, which names /usr too. Both now
  # name the prefix.
  local files=()
  mapfile -t files < <(find "$prefix/usr" \( -name '*.pc' -o -name '*.cmake' \) -type f)
  sed -i -E "/^[[:space:]]*#/!s#(=|-I|-L|\")/usr(/|\"|[[:space:]]|\$)#\1$prefix/usr\2#g" "${files[@]}"
  local leftover
  leftover=$(grep -vE '^[[:space:]]*#' "${files[@]}" | grep -E '(=|-I|-L|")/usr(/|"|[[:space:]]|$)' || true)
  [ -z "$leftover" ] || echo "install-deps: still naming /usr: $leftover" >&2
  leftover=$(find "$prefix" -type l -lname '/*')
  [ -z "$leftover" ] || echo "install-deps: absolute links left: $leftover" >&2

  # The fallback runtime libraries the system lacks, one link each in fallback/missing.
  local soname found have_missing=0
  mkdir -p "$prefix/fallback/missing"
  for soname in "${offline_fallback_sonames[@]}"; do
    if { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q "^[[:space:]]*$soname "; then continue; fi
    found=0
    for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
      [ -e "$d/$soname" ] && found=1
    done
    [ $found -eq 1 ] && continue
    local copy
    copy=$(find "$prefix/fallback" -name "$soname" \( -type f -o -type l \) -not -path '*/missing/*' | head -1)
    if [ -n "$copy" ]; then
      ln -sfn "$copy" "$prefix/fallback/missing/$soname"
      have_missing=1
      echo "install-deps: the system has no $soname: using Debian's ($copy)"
    else
      echo "install-deps: the system has no $soname, nor has $dir" >&2
    fi
  done

  # The tools the machine lacks, one link each in tools/.
  local tool
  mkdir -p "$prefix/tools"
  for tool in "${offline_tools[@]}"; do
    command -v "$tool" >/dev/null && continue
    if [ -x "$prefix/usr/bin/$tool" ]; then
      ln -sfn "$prefix/usr/bin/$tool" "$prefix/tools/$tool"
      echo "install-deps: the system has no $tool: using Debian's"
    else
      echo "install-deps: the system has no $tool, nor has $dir" >&2
    fi
  done

  # pytest's wheels, unpacked (pure Python), for a python3 that has no pytest.
  local python_dir=""
  if ls "$dir"/wheels/*.whl >/dev/null 2>&1 && command -v python3 >/dev/null; then
    python_dir=$prefix/python
    python3 - "$python_dir" "$dir"/wheels/*.whl <<'EOF'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
EOF
  fi

  # DeepSpeed and its needs for the GPU peers, unpacked apart: only the peer scripts see them.
  if ls "$dir"/peer-wheels/*.whl >/dev/null 2>&1 && command -v python3 >/dev/null; then
    python3 - "$prefix/peers-python" "$dir"/peer-wheels/*.whl <<'EOF'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
EOF
  fi

  local libdir pkgdirs=() libdirs=()
  for libdir in "$prefix"/usr/lib/*-linux-gnu; do
    [ -d "$libdir" ] || continue
    libdirs+=("$libdir")
    [ -d "$libdir/pkgconfig" ] && pkgdirs+=("$libdir/pkgconfig")
  done
  [ -d "$prefix/usr/share/pkgconfig" ] && pkgdirs+=("$prefix/usr/share/pkgconfig")
  [ $have_missing -eq 1 ] && libdirs+=("$prefix/fallback/missing")
  {
    echo "# Written by scripts/install-deps.sh --from $dir: source it before configuring zero."
    echo "zero_offline_prepend() {  # VAR DIR...: puts the DIRs, in order, before VAR's entries"
    echo '  local var=$1 d i; shift'
    echo '  for ((i = $#; i >= 1; i--)); do'
    echo '    d=${!i}'
    echo '    case ":${!var:-}:" in *":$d:"*) ;; *) export "$var=$d${!var:+:${!var}}" ;; esac'
    echo '  done'
    echo "}"
    echo "export ZERO_OFFLINE_PREFIX=$(printf '%q' "$prefix")"
    echo "zero_offline_prepend CMAKE_PREFIX_PATH $(printf '%q' "$prefix/usr")"
    echo "zero_offline_prepend PKG_CONFIG_PATH $(printf '%q ' "${pkgdirs[@]}")"
    echo "zero_offline_prepend LD_LIBRARY_PATH $(printf '%q ' "${libdirs[@]}")"
    if [ -n "$(ls -A "$prefix/tools")" ]; then
      echo "zero_offline_prepend PATH $(printf '%q' "$prefix/tools")"
    fi
    if [ -n "$python_dir" ]; then
      echo "# pytest where python3 has none (first on sys.path, so only then)."
      echo "python3 -c 'import pytest' 2>/dev/null ||"
      echo "  zero_offline_prepend PYTHONPATH $(printf '%q' "$python_dir")"
    fi
    echo "unset -f zero_offline_prepend"
  } >"$prefix/env.sh"
  echo "install-deps: $(ls "$dir"/*.deb | wc -l) packages unpacked into $prefix"
  echo "install-deps: source $prefix/env.sh; it sets:"
  (
    # shellcheck disable=SC1091
    . "$prefix/env.sh"
    for var in CMAKE_PREFIX_PATH PKG_CONFIG_PATH LD_LIBRARY_PATH PATH PYTHONPATH; do
      echo "  $var=${!var:-}"
    done
  )
}

case "${1:-}" in
  --download)
    [ $# -eq 2 ] || usage
    download "$2"
    exit 0
    ;;
  --from)
    if [ $# -eq 2 ]; then from "$2" ""
    elif [ $# -eq 4 ] && [ "$3" = --prefix ]; then from "$2" "$4"
    else usage
    fi
    exit 0
    ;;
  "") ;;
  *) usage ;;
esac

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
