#!/usr/bin/env bash
# OpenMPI for the collectives benchmark's peer row (`cargo xtask bench-collectives` times
# OpenMPI's own MPI_Allreduce between processes on this machine when `mpirun` and `mpicc`
# are on the PATH, and says the row is missing otherwise). Debian/Ubuntu packages; a no-op
# when both commands are already there.
set -euo pipefail
if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
    echo "install-mpi: $(mpirun --version 2>/dev/null | head -1) is already installed"
    exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
echo "install-mpi: $(mpirun --version 2>/dev/null | head -1) installed"
