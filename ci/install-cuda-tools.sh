#!/usr/bin/env bash
# NVRTC and ptxas for `cargo xtask kernels`, from NVIDIA's PyPI wheels of one CUDA version
# (12.9): no GPU and no CUDA toolkit needed. PTX from CUDA 12.x tools loads on the lent
# GPU's driver (CUDA 13.0); PTX from a newer NVRTC (13.x) than the driver would not.
#   nvidia-cuda-nvrtc-cu12    libnvrtc.so.12 (and its builtins)
#   nvidia-cuda-runtime-cu12  include/ (cuda_fp16.h, cuda_bf16.h) that NVRTC needs
#   nvidia-cuda-nvcc-cu12     bin/ptxas, which assembles the PTX as the driver would
# Installed with `pip install --target` into $MIRRA_CUDA_TOOLS (default
# ~/.cache/mirra/cuda-tools-12.9); prints that folder. Idempotent: a complete folder is kept.
set -euo pipefail
dir=${MIRRA_CUDA_TOOLS:-$HOME/.cache/mirra/cuda-tools-12.9}
wheels=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86)
complete() {
  [ -f "$dir/.complete" ] && [ -x "$dir/nvidia/cuda_nvcc/bin/ptxas" ] \
    && ls "$dir"/nvidia/cuda_nvrtc/lib/libnvrtc.so.12* >/dev/null 2>&1 \
    && [ -f "$dir/nvidia/cuda_runtime/include/cuda_fp16.h" ]
}
if ! complete; then
  python=$(command -v python3 || command -v python || true)
  if [ -z "$python" ]; then
    echo "install-cuda-tools: python3 is needed to install NVIDIA's wheels (apt-get install python3-pip)" >&2
    exit 1
  fi
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      (apt-get install -y python3-pip || sudo apt-get install -y python3-pip) >&2
    fi
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "${wheels[@]}" >&2
  chmod +x "$dir"/nvidia/cuda_nvcc/bin/* 2>/dev/null || true
  complete_check=$(ls "$dir"/nvidia/cuda_nvrtc/lib/ 2>/dev/null | tr '\n' ' ')
  touch "$dir/.complete"
  if ! complete; then
    echo "install-cuda-tools: $dir is missing a tool after pip (nvrtc lib: $complete_check)" >&2
    exit 1
  fi
fi
echo "$dir"
