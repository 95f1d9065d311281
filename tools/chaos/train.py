"""The chaos tool's workload: a program that knows nothing of gpusnap, with enough state (a
numpy array of STATE_MB) that a snapshot's write takes long enough to be killed in the middle.
Deterministic: a seeded generator drives every change. usage: train.py OUT STEPS [STATE_MB]"""

import json
import os
import sys
import time

import numpy as np

out, steps = sys.argv[1], int(sys.argv[2])
state_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 48
rng = np.random.default_rng(7)
weights = rng.standard_normal(state_mb * (1 << 20) // 8)
losses = []


def progress(step: int) -> None:
    tmp = os.path.join(out, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(out, "progress"))


for step in range(steps):
    start = int(rng.integers(0, weights.size - 65536))
    weights[start : start + 65536] += 0.01 * rng.standard_normal(65536)
    weights *= 0.9999
    losses.append(float(weights[start]))
    progress(step + 1)
    time.sleep(0.02)

with open(os.path.join(out, "final.json"), "w") as f:
    json.dump({"weights": weights.view(np.uint64)[::4096].tolist(), "sum": float(weights.sum()), "losses": losses,
               "next": float(rng.random())}, f)
