#!/usr/bin/env bash
# The `mpi` collectives backend (cargo feature `mpi`, issue 18): OpenMPI and libclang
# installed (ci/install-mpi.sh), the feature build linted, and its tests, which run this
# crate's MPI test binary under `mpirun --oversubscribe` on 2, 3 and 4 ranks (every
# collective, dtype, operator and root against closed forms; mismatches; a silent rank
# named at the deadline and the job ended).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-mpi.sh
cargo clippy --locked -p mirra-collectives -p mirra --features mpi --all-targets -- -D warnings
cargo test --locked -p mirra-collectives --features mpi --test mpi
