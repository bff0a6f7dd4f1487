"""PyTorch measuring what `xtask gpu-probe` measures, the same way, on the same GPU.

Same sizes and definitions as mirra_cuda::probe: a 1 GiB host->device and device->host copy
(pageable and pinned, wall time with a synchronize), a device copy (bytes read + written,
CUDA events, 10 timed after one warm-up), f32 matmul 4096 (TF32 off, as cuBLAS's default
math mode), bf16 matmul 8192, and y += 0.5 x over 64M f32 (x read, y read and written).
Then the run `mirra train --device cuda:0 --epochs 3 --batch-size 256` does, in eager
PyTorch: the MLP 784-128-64-10 (ReLU, softmax), Adam(lr 1e-3), 8,000 examples of uint8
pixels shuffled per epoch, each batch scaled on the host and copied to the device, the loss
read back every step; samples/s of the last epoch.
Writes {"torch": version, "device": name, "figures": {...}} or {"error": why}.
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()

    def write(obj):
        with open(args.json, "w") as f:
            json.dump(obj, f, indent=1)

    try:
        import torch
    except Exception as e:  # no PyTorch: the table says so
        write({"error": f"torch does not import: {e}"})
        print(f"PyTorch reference: torch does not import ({e})")
        return 0
    if not torch.cuda.is_available():
        write({"error": "torch.cuda.is_available() is False", "torch": torch.__version__})
        print("PyTorch reference: no CUDA device visible to torch")
        return 0

    dev = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False
    figures = {}

    def wall(f):
        torch.cuda.synchronize()
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def events(f, iters=args.iters):
        f()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            f()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    n = args.copy_mib << 20
    host = torch.randint(0, 256, (n,), dtype=torch.uint8)
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    figures["h2d_pageable_gbs"] = n / wall(lambda: d.copy_(host)) / 1e9
    figures["d2h_pageable_gbs"] = n / wall(lambda: host.copy_(d)) / 1e9
    pinned = host.pin_memory()
    figures["h2d_pinned_gbs"] = n / wall(lambda: d.copy_(pinned, non_blocking=True)) / 1e9
    figures["d2h_pinned_gbs"] = n / wall(lambda: pinned.copy_(d, non_blocking=True)) / 1e9
    d2 = torch.empty_like(d)
    figures["d2d_copy_gbs"] = 2 * n / events(lambda: d2.copy_(d)) / 1e9
    del host, pinned, d, d2

    for key, dtype, size in [("gemm_f32_tflops", torch.float32, 4096), ("gemm_bf16_tflops", torch.bfloat16, 8192)]:
        a = torch.rand(size, size, device=dev, dtype=dtype) * 2 - 1
        b = torch.rand(size, size, device=dev, dtype=dtype) * 2 - 1
        c = torch.empty(size, size, device=dev, dtype=dtype)
        s = events(lambda: torch.mm(a, b, out=c))
        figures[key] = 2 * size**3 / s / 1e12
        del a, b, c

    m = 64 << 20
    x = torch.rand(m, device=dev) * 2 - 1
    y = torch.rand(m, device=dev) * 2 - 1
    figures["axpy_gbs"] = 3 * 4 * m / events(lambda: y.add_(x, alpha=0.5)) / 1e9

    figures["mlp_train_samples_s"] = mlp_training(torch, dev)

    write({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "figures": figures})
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}:")
    for k, v in figures.items():
        print(f"  {k:<18} {v:10.1f}")
    return 0


def mlp_training(torch, dev, examples=8000, batch=256, epochs=3):
    g = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (examples, 784), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (examples,), generator=g)
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    ).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()  # softmax + cross-entropy, as mirra's MLP trains
    rate = 0.0
    for _ in range(epochs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        order = torch.randperm(examples, generator=g)
        for i in range(0, examples, batch):
            idx = order[i : i + batch]
            x = (pixels[idx].float() / 255.0).to(dev)
            y = labels[idx].to(dev)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            loss.item()
        torch.cuda.synchronize()
        rate = examples / (time.perf_counter() - t)
    return rate


if __name__ == "__main__":
    sys.exit(main())
