"""The GPU check's one table (markdown): the probe's steps, each figure beside PyTorch's,
and the GPU tests. Reads what gpu-check.sh wrote; a missing file becomes a row saying so."""

import argparse
import json
import os

# Figures the probe and torch_reference.py both measure: key, what it is, unit.
PAIRED = [
    ("h2d_pageable_gbs", "host->device 1 GiB, pageable", "GB/s"),
    ("d2h_pageable_gbs", "device->host 1 GiB, pageable", "GB/s"),
    ("h2d_pinned_gbs", "host->device 1 GiB, pinned", "GB/s"),
    ("d2h_pinned_gbs", "device->host 1 GiB, pinned", "GB/s"),
    ("d2d_copy_gbs", "device copy 1 GiB (read + written)", "GB/s"),
    ("gemm_f32_tflops", "f32 matmul 4096 (no TF32)", "TFLOP/s"),
    ("gemm_bf16_tflops", "bf16 matmul 8192", "TFLOP/s"),
    ("axpy_gbs", "y += a x, 64M f32 (read + written)", "GB/s"),
    ("mlp_train_samples_s", "MNIST MLP training, batch 256, last of 3 epochs", "samples/s"),
]


def load(path):
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"unreadable {path}: {e}"}


def cell(s):
    return str(s).replace("|", "/").replace("\n", " ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe")
    ap.add_argument("--torch")
    ap.add_argument("--results")
    ap.add_argument("--train", help="the History JSON of `mirra train --device cuda:0`")
    a = ap.parse_args()
    probe, torch = load(a.probe), load(a.torch)

    rows = []
    if probe is None:
        rows.append(("probe", "(no probe.json)", "", "", "FAILED"))
    else:
        for s in probe.get("steps", []):
            rows.append(("probe", s["name"], cell(s["detail"]), "", s["status"]))
    figs = {}
    for s in (probe or {}).get("steps", []):
        figs.update(s.get("figures", {}))
    history = load(a.train) or {}
    if history.get("samples_per_sec"):
        figs["mlp_train_samples_s"] = history["samples_per_sec"][-1]
    tfigs = (torch or {}).get("figures", {})
    twhy = "not run" if torch is None else torch.get("error", "")
    for key, what, unit in PAIRED:
        ours, theirs = figs.get(key), tfigs.get(key)
        if ours is None and theirs is None and probe is not None and probe.get("no_driver"):
            continue
        o = f"{ours:.1f} {unit}" if ours is not None else "not measured"
        t = f"{theirs:.1f} {unit}" if theirs is not None else (twhy or "not measured")
        ratio = f"{ours / theirs:.2f}" if ours and theirs else ""
        rows.append(("vs PyTorch", what, o, t, ratio))
    if a.results and os.path.exists(a.results):
        with open(a.results) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:
                    rows.append((parts[0], parts[1], cell(parts[3]), "", parts[2]))

    title = "GPU check"
    if torch and "torch" in torch:
        title += f" (PyTorch {torch['torch']} on {torch.get('device', '?')})"
    print(f"\n### {title}\n")
    print("| part | check | mirra | PyTorch | result |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(cell(c) for c in r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
