#!/usr/bin/env bash
# OpenMPI, and libclang for rsmpi's bindings: the `mpi` collectives backend (cargo feature
# `mpi`, ci/mpi.sh) and the collectives benchmark's peer row (`cargo xtask bench-collectives`
# times OpenMPI's own MPI_Allreduce between processes on this machine when `mpirun` and
# `mpicc` are on the PATH, and says the row is missing otherwise). Debian/Ubuntu packages; a
# no-op when they are already there.
set -euo pipefail
have_clang() {
    ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1
}
if command -v mpirun >/dev/null && command -v mpicc >/dev/null && have_clang; then
    echo "install-mpi: $(mpirun --version 2>/dev/null | head -1) and libclang are already installed"
    exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev libclang-dev >/dev/null
echo "install-mpi: $(mpirun --version 2>/dev/null | head -1) installed"
