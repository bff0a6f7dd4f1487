#!/usr/bin/env bash
# The scaling model's checks (docs/SCALING.md, "Validation"): every check of the model
# within its band, this machine's host model included (exit 0); and the model without
# communication and the model with twice the bandwidth must each fall outside some band
# (exit 1): a check suite that a wrong model passes checks nothing. Each run measures this
# machine quickly (about 10 s) for the host model.
# xtask runs in release (the cargo alias): the measurement means nothing in a debug build.
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${CARGO_TARGET_DIR:-target}/bench"
cargo --locked xtask scaling --validate --quick
for ablation in no-comm double-bandwidth; do
    status=0
    cargo --locked xtask scaling --validate --quick --ablate "$ablation" \
        --out "$bench/scaling-validate-$ablation.json" || status=$?
    if [ "$status" -ne 1 ]; then
        echo "scaling-validate: --ablate $ablation exited $status; expected 1 (some check must reject it)" >&2
        exit 1
    fi
    echo "scaling-validate: --ablate $ablation rejected, as it must be"
done
