"""Global random number generator states: read at the safe point, written back on restore.

Only generators of modules the program has imported are touched (importing numpy or torch here
would cost the program seconds and change nothing). numpy ``Generator`` objects are ordinary
objects of the graph and travel with it.
"""

from __future__ import annotations

import random
import sys


def capture() -> dict:
    states: dict = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        states["numpy"] = np.random.get_state(legacy=False)
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized():
            states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore(states: dict) -> None:
    random.setstate(states["random"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "torch" in states:
        import torch

        torch.set_rng_state(states["torch"])
        if "torch.cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["torch.cuda"])
