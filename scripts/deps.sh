#!/usr/bin/env bash
# Installs the Debian packages ashl's build, tests and demo use. Safe to rerun.
# python3-doc: the language model's corpus (Python's documentation sources, examples/lm, docs/lm.md);
# libopenblas0-serial: the BLAS its processes load (Debian's torch uses the generic libblas.so.3).
# Sourced by scripts/test and scripts/demo; needs root (or sudo) on Debian 12.
set -euo pipefail
ashl_packages=(cmake ninja-build g++ clang libclang-rt-14-dev libboost-test-dev zlib1g-dev
               nlohmann-json3-dev libucx-dev ucx-utils libssl-dev dataset-fashion-mnist gnuplot-nox iproute2
               libopenmpi-dev openmpi-bin libtorch-dev python3-torch python3-numpy python3-dev pybind11-dev
               python3-pytest python3-pip python3-venv
               python3-doc libopenblas0-serial)
missing=()
for p in "${ashl_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "ashl: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# CUDA is optional; nvcc is found on PATH or in /usr/local/cuda.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
