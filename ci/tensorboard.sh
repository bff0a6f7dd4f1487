#!/usr/bin/env bash
# Proves that TensorBoard loads the event files `mirra train --logdir` writes: installs
# tensorboard from PyPI into a venv under target/ (system Pythons may refuse pip
# installs), trains two short epochs and reads the runs with TensorBoard's own
# EventAccumulator (ci/check_tensorboard.py).
# The dev profile is the one ci/test.sh has just built, so the binary is not rebuilt (a
# release build would add minutes of compiling for a run of under a second).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/tensorboard-venv
logdir=target/tb-ci
epochs=2
if ! "$venv/bin/python" -c "import tensorboard" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "tensorboard>=2.14,<3"
fi
"$venv/bin/python" -c "import tensorboard; print('tensorboard', tensorboard.__version__)"
rm -rf "$logdir"
cargo run --locked -p mirra -- train --epochs "$epochs" --batch-size 256 \
    --logdir "$logdir"
"$venv/bin/python" ci/check_tensorboard.py "$logdir" "$epochs"
