"""A program that holds much host memory the writer never reads: a ballast of BALLAST_MB
touched once and held by the numpy module (outside every root gpusnap walks), and a random state
of STATE_MB of which each step changes a slice: OUT STEPS STATE_MB BALLAST_MB."""

import sys

import numpy as np

from pace import finish, progress


def main(steps: int, state_mb: int, ballast_mb: int) -> None:
    np.gpusnap_test_ballast = np.ones(ballast_mb << 17)  # every page touched: resident
    rng = np.random.default_rng(3)
    state = rng.standard_normal(max(1, state_mb << 17))
    for step in range(steps):
        at = int(rng.integers(0, max(1, state.size - 4096)))
        state[at : at + 4096] += 0.5
        progress(step + 1)
    finish(head=state[:16], total=float(state.sum()), step=steps)


if __name__ == "__main__":
    main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
