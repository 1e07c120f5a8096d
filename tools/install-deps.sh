#!/usr/bin/env bash
# Installs the Debian packages meshmoe needs, only those missing. Idempotent: prints one line and
# does nothing when everything is present. Off Debian, or not root, it says what to install instead.
set -euo pipefail
PKGS=(build-essential pkg-config libopenmpi-dev openmpi-bin libhdf5-openmpi-dev libopenblas-dev catch2
      libtomlplusplus-dev libcli11-dev libsentencepiece-dev sentencepiece gettext python3-numpy python3-h5py python3-matplotlib python3-torch
      python3-nltk)
[ "${1:-}" = "--slurm" ] && PKGS+=(slurm-wlm munge)
[ "${1:-}" = "--fuzz" ] && PKGS+=(clang libclang-rt-14-dev)  # make fuzz: libFuzzer, sanitizers
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
else
  echo "install-deps: not a Debian system; install the equivalents of: ${PKGS[*]}" >&2
  echo "install-deps: (on a cluster: module load openmpi hdf5/parallel openblas; toml++ 3, CLI11, Catch2 v2 headers)" >&2
  exit 0
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
