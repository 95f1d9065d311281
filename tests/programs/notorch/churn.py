"""A numpy state every byte of which changes each step, so that each snapshot writes all of it
anew: OUT STEPS STATE_KB."""

import sys

import numpy as np

from pace import finish, progress


def main(steps: int, state_kb: int) -> None:
    rng = np.random.default_rng(5)
    state = np.zeros(state_kb * 1024 // 8)
    for step in range(steps):
        state[:] = rng.standard_normal(state.size)
        progress(step + 1)
    finish(head=state[:16], step=steps)


if __name__ == "__main__":
    main(int(sys.argv[2]), int(sys.argv[3]))
