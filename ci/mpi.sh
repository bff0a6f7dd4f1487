#!/usr/bin/env bash
# The `mpi` collectives backend (cargo feature `mpi`, issue 18): OpenMPI and libclang
# installed (ci/install-mpi.sh), the feature build linted, and its tests, which run this
# crate's MPI test binary under `mpirun --oversubscribe` on 2, 3 and 4 ranks (every
# collective, dtype, operator and root against closed forms; mismatches; a silent rank
# named at the deadline and the job ended; the hierarchical backend of 2 and 3 workers),
# and `mirra train` under mpirun (workers following one process and one device, rank 0
# alone writing, a killed worker resumed to the uninterrupted bits, a stopped worker named
# at the deadline, deterministic workers ending with one replica's bits).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-mpi.sh
cargo clippy --locked -p mirra-collectives -p mirra-strategy -p mirra --features mpi --all-targets -- -D warnings
cargo test --locked -p mirra-collectives --features mpi --test mpi
# The conformance suite itself under mpirun, on the mpi and the hierarchical backends.
cargo test --locked -p mirra-collectives --features mpi --lib conformance::under_mpirun
cargo test --locked -p mirra --features mpi --test mpi
