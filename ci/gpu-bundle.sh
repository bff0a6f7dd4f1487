#!/usr/bin/env bash
# Builds the GPU bundle (cargo xtask gpu-bundle: under 64 MiB, or it fails) and runs its
# check here, where there is no GPU: it must say so plainly and exit 3, not crash or pass.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo xtask gpu-bundle
log=$(mktemp)
set +e
OUT=$(mktemp -d) bash target/gpu-bundle/gpu-check.sh >"$log" 2>&1
rc=$?
set -e
cat "$log"
if [ "$rc" != 3 ] || ! grep -q "^NO GPU: no CUDA driver found" "$log"; then
  echo "ci/gpu-bundle.sh: the GPU check on a machine without a GPU exited $rc without saying" \
    "'NO GPU: no CUDA driver found' (expected exit status 3)" >&2
  exit 1
fi
echo "gpu bundle: built, and its no-GPU path says so (exit 3)"
