#!/usr/bin/env bash
# The scaling report: a quick measurement on this machine (`cargo xtask scaling --quick`,
# about 10 s), the modelled figures of mirra-scaling, target/reports/ written, and every
# figure compared with benches/baselines/scaling.json. A figure past its tolerance fails
# the step; the markdown report is printed either way.
# xtask runs in release (the cargo alias): the measurement means nothing in a debug build.
set -euo pipefail
cd "$(dirname "$0")/.."
report="${CARGO_TARGET_DIR:-target}/reports/scaling.md"
rm -f "$report"
status=0
cargo --locked xtask report --measure --quick || status=$?
if [ -f "$report" ]; then
    cat "$report"
fi
exit "$status"
