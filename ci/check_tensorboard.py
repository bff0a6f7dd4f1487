#!/usr/bin/env python3
"""Proves that TensorBoard itself loads the event files of `mirra train --logdir`.

Usage: check_tensorboard.py LOGDIR EPOCHS

Loads the runs LOGDIR/train and LOGDIR/validation with TensorBoard's EventAccumulator
(the loader behind `tensorboard --logdir`), checks that each has its expected scalar tags
with one finite value per epoch at steps 0..EPOCHS-1, and prints them as a table.
Exits 1, naming what is wrong, otherwise.
"""

import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EXPECTED = {
    "train": [
        "epoch_loss",
        "epoch_accuracy",
        "epoch_learning_rate",
        "epoch_samples_per_sec",
    ],
    "validation": ["epoch_loss", "epoch_accuracy"],
}


def load(run_dir):
    if not os.path.isdir(run_dir):
        raise SystemExit(f"FAIL: no run directory {run_dir}")
    # size_guidance 0: keep every scalar instead of a reservoir sample.
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    logdir, epochs = sys.argv[1], int(sys.argv[2])
    problems, rows = [], []
    for run, tags in EXPECTED.items():
        acc = load(os.path.join(logdir, run))
        found = acc.Tags()["scalars"]
        missing = sorted(set(tags) - set(found))
        if missing:
            problems.append(f"{run}: missing tags {missing} (found {sorted(found)})")
        for tag in tags:
            if tag not in found:
                continue
            events = acc.Scalars(tag)
            steps = [e.step for e in events]
            values = [e.value for e in events]
            if steps != list(range(epochs)):
                problems.append(f"{run}/{tag}: steps {steps}, expected 0..{epochs - 1}")
            bad = [v for v in values if not math.isfinite(v)]
            if bad:
                problems.append(f"{run}/{tag}: non-finite values {bad}")
            rows.append((run, tag, values))
    width = max(len(f"{r}/{t}") for r, t, _ in rows) if rows else 0
    header = "  ".join(f"{'epoch ' + str(e):>12}" for e in range(epochs))
    print(f"{'run/tag':<{width}}  {header}")
    for run, tag, values in rows:
        cells = "  ".join(f"{v:>12.6g}" for v in values)
        print(f"{run + '/' + tag:<{width}}  {cells}")
    if problems:
        for p in problems:
            print(f"FAIL: {p}")
        sys.exit(1)
    print(f"OK: TensorBoard's EventAccumulator loaded {len(rows)} scalar series from {logdir}")


if __name__ == "__main__":
    main()
