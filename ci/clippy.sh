#!/usr/bin/env bash
# Lints on every target (tests, benches, xtask), warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy --workspace --all-targets --locked -- -D warnings
