#!/usr/bin/env bash
# Formatting is part of the contract: CI fails on any diff.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
