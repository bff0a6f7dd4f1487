"""gloo's all-reduce through torch.distributed, timed the way `cargo xtask bench-collectives`
times mirra's collectives (xtask/src/ranks.rs), so that the two can stand in one table:

  per iteration: every rank writes its inputs afresh, barrier, then the all-reduce alone is
  timed on every rank; an iteration's time is the slowest rank's; after each iteration
  every rank counts the elements that differ from the closed form (#wrong).

Ranks are processes of this machine (one intra-op thread each), joined through a file
store. Inputs: rank r's element i = (i % 1024) + r + 1 (f32), sums exact in any order.

Usage: python3 gloo_allreduce.py WORLD_SIZE BYTES:WARMUP:ITERS ...
Prints {"torch": VERSION} first, then one JSON object per size:
  {"bytes": B, "count": C, "warmup": W, "seconds": [s, ...], "wrong": K}
When torch does not import it prints {"error": "torch does not import: ..."} and exits 3.
"""

import json
import os
import sys
import tempfile
import time

PERIOD = 1024


def parse(specs):
    sizes = []
    for spec in specs:
        try:
            b, w, i = (int(x) for x in spec.split(":"))
        except ValueError:
            sys.exit(f"gloo_allreduce: bad size spec `{spec}` (BYTES:WARMUP:ITERS)")
        if b < 4 * PERIOD or b % (4 * PERIOD) or w < 0 or i < 1:
            sys.exit(f"gloo_allreduce: bad size spec `{spec}` (BYTES a multiple of 4 KiB)")
        sizes.append((b, w, i))
    return sizes


def rank_main(rank, n, store, sizes):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n)
    base = torch.arange(PERIOD, dtype=torch.float32)
    row_in = base + (rank + 1)
    row_sum = n * (base + 1) + n * (n - 1) // 2
    for bytes_, warmup, iters in sizes:
        count = bytes_ // 4
        buf = torch.empty(count, dtype=torch.float32)
        rows = buf.view(-1, PERIOD)
        mine = torch.zeros(iters, dtype=torch.float64)
        wrong = 0
        for it in range(warmup + iters):
            rows.copy_(row_in.expand_as(rows))
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            dt = time.perf_counter() - t
            if it >= warmup:
                mine[it - warmup] = dt
            wrong += int((rows != row_sum).sum())
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        total = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(total)
        if rank == 0:
            print(json.dumps({"bytes": count * 4, "count": count, "warmup": warmup,
                              "seconds": mine.tolist(), "wrong": int(total[0])}), flush=True)
        del buf, rows
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    n = int(sys.argv[1])
    sizes = parse(sys.argv[2:])
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001 - any import failure means no gloo row
        print(json.dumps({"error": f"torch does not import: {type(e).__name__}: {e}"}))
        sys.exit(3)
    if not dist.is_available() or not dist.is_gloo_available():
        print(json.dumps({"error": f"torch {torch.__version__} has no gloo backend"}))
        sys.exit(3)
    print(json.dumps({"torch": torch.__version__}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(rank_main, args=(n, store, sizes), nprocs=n, start_method="spawn")


if __name__ == "__main__":
    main()
