"""Shared by the test programs: progress for the test harness, final state for comparison."""

import os

import torch
from notorch.pace import OUT, progress  # noqa: F401 - the torch-free half, shared with notorch/


def save_step_state(step: int, model, optimizer) -> None:
    os.makedirs(os.path.join(OUT, "states"), exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(OUT, "states", f"{step}.pt"))


def finish(**state) -> None:
    torch.save(state, os.path.join(OUT, "final.pt"))
