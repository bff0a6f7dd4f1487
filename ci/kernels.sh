#!/usr/bin/env bash
# The CUDA kernels (issue 14): every `crates/mirra-cuda/kernels/*.cu` compiles with NVRTC and
# assembles with ptxas for sm_80 and sm_90, and the committed PTX is what the sources compile
# to now. No GPU needed: the tools are NVIDIA's PyPI wheels (ci/install-cuda-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo --locked xtask kernels --check
