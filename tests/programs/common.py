"""Shared by the test programs: progress for the test harness, final state for comparison."""

import os
import sys
import time

import torch

OUT = sys.argv[1]
STEP_SLEEP_S = float(os.environ.get("TEST_STEP_SLEEP_S", "0.01"))


def progress(step: int) -> None:
    """Tell the harness how far training got (it sends signals by step), then pace the run."""
    tmp = os.path.join(OUT, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(OUT, "progress"))
    time.sleep(STEP_SLEEP_S)


def save_step_state(step: int, model, optimizer) -> None:
    os.makedirs(os.path.join(OUT, "states"), exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(OUT, "states", f"{step}.pt"))


def finish(**state) -> None:
    torch.save(state, os.path.join(OUT, "final.pt"))
