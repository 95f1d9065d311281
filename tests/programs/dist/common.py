"""Shared by the distributed test programs (run under torchrun): each rank reports its progress
in OUT/rank<R>/progress and writes its final state to OUT/rank<R>/final.pt."""

import os
import sys
import time

import torch

RANK = int(os.environ.get("RANK", "0"))
OUT = os.path.join(sys.argv[1], f"rank{RANK}")
os.makedirs(OUT, exist_ok=True)
STEP_SLEEP_S = float(os.environ.get("TEST_STEP_SLEEP_S", "0.01"))


def progress(step: int) -> None:
    tmp = os.path.join(OUT, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(OUT, "progress"))
    time.sleep(STEP_SLEEP_S)


def finish(**state) -> None:
    torch.save(state, os.path.join(OUT, "final.pt"))
