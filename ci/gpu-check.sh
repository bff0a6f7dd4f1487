#!/usr/bin/env bash
# The GPU check. Runs on a lent GPU machine, from the folder that `cargo xtask gpu-bundle`
# builds (device tool: command `bash target/gpu-bundle/gpu-check.sh`, carry
# ["target/gpu-bundle"]); the machine needs no Rust toolchain and no network.
#   1. the GPU probe (`xtask gpu-probe`): libraries, context, a 1 GiB round trip, cuBLAS,
#      an NVRTC kernel, NCCL; `mirra topo` (the device matrix) beside `nvidia-smi topo -m`;
#   2. every GPU test: the bundled test binaries with --ignored;
#   3. `mirra train` on the GPU and on the CPU (3 epochs of the bundled MNIST);
#   4. `xtask bench --device cuda:0`: kernels, matmul and MLP training beside PyTorch;
#   5. `xtask bench-collectives --device cuda`: the CUDA ring's nccl-tests table at 2, 4 and
#      8 ranks on this GPU, against the traffic bound of the device copy;
#   6. PyTorch measuring what the probe measured and training the same MLP, beside it;
# then one table (markdown, for the session's note). Logs are written as the steps run, to
# $OUT when the device tool sets it (it brings them back), else to ./logs beside this script.
# Exit status: 0 every step passed, 1 something failed, 3 no GPU here (nothing ran on one).
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logs=${OUT:-$here/logs}
mkdir -p "$logs"
results=$logs/results.tsv # kind, name, status, detail: one line per test binary
: >"$results"
start=$SECONDS
# The test binaries travel gzipped (dev-profile builds, 3x smaller so): unpacked here once.
tests_dir=$(mktemp -d "${TMPDIR:-/tmp}/mirra-gpu-tests.XXXXXX")
trap 'rm -rf "$tests_dir"' EXIT
for z in "$here"/tests/*.gz; do
  [ -e "$z" ] || continue
  t=$tests_dir/$(basename "$z" .gz)
  gzip -dc "$z" >"$t" && chmod +x "$t" || { echo "gpu-check: cannot unpack $z" >&2; exit 1; }
done
# Each step's time limit; a short lease can lower it (STEP_TIMEOUT=120 bash gpu-check.sh).
step=${STEP_TIMEOUT:-300}
say() { echo "== $* ($((SECONDS - start)) s)"; }

# CUDA's libraries: the driver's folder, the toolkit's (its NVRTC matches the driver's CUDA
# version: PTX from a newer NVRTC does not load on an older driver), then NVIDIA's wheels.
libdirs=()
for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libdirs+=("$d")
done
if command -v python3 >/dev/null 2>&1; then
  while IFS= read -r d; do libdirs+=("$d"); done < <(python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        d = os.path.realpath(d)
        if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
            seen.add(d)
            print(d)
PY
  )
fi
# cudarc looks for libnccl.so (and .so.13, .so.12, ...); NCCL's wheel ships libnccl.so.2.
shim=$here/.libs
mkdir -p "$shim"
for d in "${libdirs[@]}"; do
  if [ -e "$d/libnccl.so.2" ] && [ ! -e "$shim/libnccl.so" ]; then
    ln -sf "$d/libnccl.so.2" "$shim/libnccl.so"
  fi
done
libpath=$shim
for d in "${libdirs[@]}"; do libpath=$libpath:$d; done
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

say "machine"
{
  head -1 "$here/MANIFEST.txt" 2>/dev/null
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  else
    echo "nvidia-smi: not on this machine"
  fi
  echo "library folders: $LD_LIBRARY_PATH"
} 2>&1 | tee "$logs/machine.log"

say "GPU probe"
timeout "$step" "$here/xtask" gpu-probe --json "$logs/probe.json" 2>&1 | tee "$logs/probe.log"
probe_rc=${PIPESTATUS[0]}

table() {
  if command -v python3 >/dev/null 2>&1; then
    python3 "$here/gpu/table.py" --probe "$logs/probe.json" --torch "$logs/torch.json" \
      --results "$results" --train "$logs/train-cuda0.json" 2>&1 | tee "$logs/table.md"
    if [ -f "$logs/bench-gpu.md" ]; then
      echo | tee -a "$logs/table.md"
      tee -a "$logs/table.md" <"$logs/bench-gpu.md"
    fi
  else
    cat "$results"
  fi
}

if [ "$probe_rc" = 3 ]; then
  tests=$(find "$tests_dir" -type f | wc -l)
  for t in "$tests_dir"/*; do
    printf 'test\t%s\tskipped\tno GPU\n' "$(basename "$t")" >>"$results"
  done
  echo "NO GPU: no CUDA driver found on this machine. Nothing ran on a GPU: the probe stopped at" \
    "its first step; $tests GPU test binaries and the PyTorch reference were skipped."
  table
  exit 3
fi

failed=0
[ "$probe_rc" = 0 ] || failed=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)

# The device matrix (`mirra topo`), beside nvidia-smi's own.
say "mirra topo"
timeout "$step" "$here/mirra" topo --json "$logs/topo.json" 2>&1 | tee "$logs/topo.log"
rc=${PIPESTATUS[0]}
nvidia-smi topo -m >"$logs/nvidia-smi-topo.log" 2>&1 || true
if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
cells=$(sed -n 2,3p "$logs/topo.log" | tr -s ' ' | paste -sd ';' -)
printf 'topo\tmirra topo (nvidia-smi topo -m in nvidia-smi-topo.log)\t%s\t%s\n' "$status" \
  "${cells:-exit status $rc}" >>"$results"
# Tests named `_on_2_gpus` / `_on_8_gpus` need that many GPUs (NCCL runs one rank per GPU);
# NCCL's suites run in processes of their own, with NCCL_ALGO set before NCCL starts.
# `child_process_` tests are started by other tests, with the environment they need.
run_tests() { # binary, log name, environment and filter arguments...
  local t=$1 name=$2
  shift 2
  say "GPU tests: $name"
  timeout "$step" env "$@" --test-threads=1 2>&1 | tee "$logs/test-$name.log"
  local rc=${PIPESTATUS[0]}
  local summary status
  summary=$(grep -E '^test result:' "$logs/test-$name.log" | tail -1)
  if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
  printf 'test\t%s\t%s\t%s\n' "$name" "$status" "${summary:-exit status $rc}" >>"$results"
}
for t in "$tests_dir"/*; do
  name=$(basename "$t")
  run_tests "$t" "$name" "$t" --ignored --skip _on_2_gpus --skip _on_8_gpus --skip child_process_
  for need in 2 8; do
    listed=$("$t" --list --ignored 2>/dev/null | grep -c "_on_${need}_gpus" || true)
    [ "$listed" -gt 0 ] || continue
    if [ "$gpus" -lt "$need" ]; then
      printf 'test\t%s (needs %s GPUs)\tnever run\t%s tests: this machine has %s GPU(s)\n' \
        "$name" "$need" "$listed" "$gpus" >>"$results"
      continue
    fi
    if [ "$need" = 2 ]; then
      run_tests "$t" "$name-on-2-gpus" "$t" --ignored _on_2_gpus
    else
      for algo in Ring Tree; do
        lower=$(echo "$algo" | tr 'A-Z' 'a-z')
        run_tests "$t" "$name-nccl-$lower-on-8-gpus" NCCL_ALGO=$algo "$t" --ignored \
          "nccl_${lower}_on_8_gpus"
      done
    fi
  done
done

# The program a user runs: `mirra train` on the GPU, then on this machine's CPU, 3 epochs of
# the bundled MNIST at batch 256 (the PyTorch reference trains the same MLP the same way).
# The GPU once more with TF32 matmuls (--tf32): the same run, another cuBLAS math mode.
for run in "cuda:0" "cpu" "cuda:0 --tf32"; do
  set -- $run
  tag=${1/:/}${2:+-tf32}
  say "mirra train --device $run"
  timeout "$step" "$here/mirra" train --device "$@" --epochs 3 --batch-size 256 \
    --history "$logs/train-$tag.json" 2>&1 | tee "$logs/train-$tag.log"
  rc=${PIPESTATUS[0]}
  last=$(grep -E '^Epoch ' "$logs/train-$tag.log" | tail -1)
  peak=$(grep -E '^Peak memory' "$logs/train-$tag.log" | tail -1)
  if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
  printf 'train\tmirra train --device %s\t%s\t%s\n' "$run" "$status" \
    "${last:-exit status $rc} ${peak}" >>"$results"
done

# The seed's networks on the GPU (issue 16): convolutions through mirra's im2col and col2im
# kernels and cuBLAS, max pooling and its gradient in mirra's window kernels, batch norm from
# the generic ops. `cnn` and `resnet20`, one epoch of the bundled MNIST on the GPU and on the
# CPU: val_loss within 2% (convolutions sum in cuBLAS's order); `resnet50`, four batches of 32
# synthetic 224x224 images on the GPU: its images/s (never run on a GPU before 2026-12-07).
for model in cnn resnet20 resnet50; do
  for dev in cuda:0 cpu; do
    [ "$model" = resnet50 ] && [ "$dev" = cpu ] && continue
    tag=$model-${dev/:/}
    extra=""
    [ "$model" = resnet50 ] && extra="--batch-size 32"
    say "mirra train --model $model --device $dev"
    timeout "$step" "$here/mirra" train --model "$model" --device "$dev" --epochs 1 $extra \
      2>&1 | tee "$logs/train-$tag.log"
    rc=${PIPESTATUS[0]}
    last=$(grep -E '^Epoch ' "$logs/train-$tag.log" | tail -1)
    if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
    printf 'train\tmirra train --model %s --device %s\t%s\t%s\n' "$model" "$dev" "$status" \
      "${last:-exit status $rc}" >>"$results"
  done
  [ "$model" = resnet50 ] && continue
  loss() { grep -E '^Epoch 1/1' "$1" | sed -E 's/.*val_loss: ([0-9.]+).*/\1/'; }
  g=$(loss "$logs/train-$model-cuda0.log"); c=$(loss "$logs/train-$model-cpu.log")
  if [ -n "$g" ] && [ -n "$c" ] &&
    awk -v g="$g" -v w="$c" 'BEGIN { d = (g - w) / w; exit !(d <= 0.02 && d >= -0.02) }'; then
    status=ok
  else
    status=FAILED; failed=1
  fi
  printf 'check\t%s val_loss GPU vs CPU (within 2%%)\t%s\t%s vs %s\n' "$model" "$status" \
    "${g:-none}" "${c:-none}" >>"$results"
done

# A run's last (3rd) epoch line: its val_loss, its samples/s; whether two val_losses agree
# within 1e-3 (relative).
val_loss() { grep -E '^Epoch 3/3' "$1" | sed -E 's/.*val_loss: ([0-9.]+).*/\1/'; }
speed() { grep -E '^Epoch 3/3' "$1" | sed -E 's/.* ([0-9]+) samples\/s.*/\1/'; }
close() {
  [ -n "$1" ] && [ -n "$2" ] &&
    awk -v g="$1" -v w="$2" 'BEGIN { d = (g - w) / w; exit !(d <= 1e-3 && d >= -1e-3) }'
}

# The mirrored strategy on GPUs (issue 15): 2 replicas in sync on this one GPU per device
# backend (and one replica on each of two GPUs where there are two), 3 epochs; val_loss
# within 1e-3 of the one-GPU run's (the sums of two halves round differently in the last
# bits), and samples/s beside the one-GPU run's: the scaling row (on one GPU, two replicas
# share it: the row shows the strategy's cost, not a speed-up).
mirrored() { # tag, --device value, collective, [--replicas N]
  local tag=$1 dev=$2 coll=$3
  shift 3
  local log=$logs/train-$tag.log
  say "mirra train --device $dev $* --collective $coll"
  timeout "$step" "$here/mirra" train --device "$dev" "$@" --collective "$coll" --epochs 3 \
    --batch-size 256 >"$log" 2>&1
  local rc=$?
  local got want fast one status=FAILED
  got=$(val_loss "$log")
  want=$(val_loss "$logs/train-cuda0.log")
  fast=$(speed "$log")
  one=$(speed "$logs/train-cuda0.log")
  if [ "$rc" = 0 ] && close "$got" "$want"; then status=ok; else failed=1; fi
  printf 'mirrored\t%s: --device %s %s --collective %s\t%s\tval_loss %s (one GPU: %s); %s samples/s (one GPU: %s, ratio %s); exit status %s\n' \
    "$tag" "$dev" "$*" "$coll" "$status" "${got:-none}" "${want:-none}" "${fast:-none}" \
    "${one:-none}" "$(awk -v a="${fast:-0}" -v b="${one:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')" \
    "$rc" >>"$results"
}
mirrored cuda-ring-2-on-1 cuda:0 cuda-ring --replicas 2
if [ "$gpus" -ge 2 ]; then
  mirrored cuda-ring-on-2 cuda:0,cuda:1 cuda-ring
  NCCL_ALGO=Ring mirrored nccl-ring-on-2 cuda:0,cuda:1 nccl-ring
  NCCL_ALGO=Tree mirrored nccl-tree-on-2 cuda:0,cuda:1 nccl-tree
else
  printf 'mirrored\tnccl-ring, nccl-tree, cuda-ring on 2 GPUs\tnever run\tneeds 2 GPUs: this machine has %s\n' \
    "$gpus" >>"$results"
fi

# Checkpoints are portable across devices and replica counts: 2 epochs on 2 CPU replicas
# resumed to 3 on the GPU, and 2 on the GPU resumed to 3 on 2 CPU replicas, each ending
# within 1e-3 of the uninterrupted CPU run's val_loss (train-cpu.log above).
resume() { # tag, what, first run's flags, resumed run's flags
  local dir=$logs/ckpt-$1 log=$logs/resume-$1.log
  rm -rf "$dir"
  say "resume: $2"
  # shellcheck disable=SC2086 # the flags are words
  timeout "$step" "$here/mirra" train --epochs 2 --batch-size 256 --checkpoint-dir "$dir" $3 \
    >"$log" 2>&1 &&
    timeout "$step" "$here/mirra" train --epochs 3 --batch-size 256 --checkpoint-dir "$dir" \
      --resume $4 >>"$log" 2>&1
  local rc=$?
  local got want
  got=$(val_loss "$log")
  want=$(val_loss "$logs/train-cpu.log")
  local status=FAILED
  if [ "$rc" = 0 ] && close "$got" "$want"; then status=ok; else failed=1; fi
  printf 'resume\t%s\t%s\tval_loss %s after resuming (uninterrupted CPU run: %s), exit status %s\n' \
    "$2" "$status" "${got:-none}" "${want:-none}" "$rc" >>"$results"
}
resume cpu2-gpu "2 CPU replicas -> cuda:0" "--replicas 2" "--device cuda:0"
resume gpu-cpu2 "cuda:0 -> 2 CPU replicas" "--device cuda:0" "--replicas 2"

# Issue 14's GPU figures: kernels against the device copy, matmul against cuBLAS, the MLP
# against PyTorch on this GPU and mirra on this machine's CPU, peak device memory.
say "GPU benchmark (xtask bench --device cuda:0)"
timeout "$step" "$here/xtask" bench --device cuda:0 --out "$logs/bench-gpu.json" 2>&1 |
  tee "$logs/bench-gpu.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
printf 'bench\txtask bench --device cuda:0\t%s\texit status %s\n' "$status" "$rc" >>"$results"

# Issue 15's GPU collectives: the CUDA ring at 2, 4 and 8 ranks on this GPU, against the
# traffic bound derived from the device copy measured in the same run.
say "GPU collectives (xtask bench-collectives --device cuda)"
timeout "$step" "$here/xtask" bench-collectives --device cuda --world-sizes 2,4,8 \
  --out "$logs/collectives-gpu.json" 2>&1 | tee "$logs/collectives-gpu.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then status=ok; else status=FAILED; failed=1; fi
targets=$(grep -E '^# target ' "$logs/collectives-gpu.log" | sed -E 's/^# target cuda_ring_([0-9]+)_ranks_vs_traffic_bound: /\1 ranks /' | paste -sd ';' -)
printf 'bench\txtask bench-collectives --device cuda (256 MiB all_reduce over the traffic bound, >= 0.6)\t%s\t%s\n' \
  "$status" "${targets:-exit status $rc}" >>"$results"

say "PyTorch reference"
PYTHONUNBUFFERED=1 timeout "$step" python3 "$here/gpu/torch_reference.py" --json "$logs/torch.json" \
  2>&1 | tee "$logs/torch.log"

say "table"
table
say "done"
exit $failed
