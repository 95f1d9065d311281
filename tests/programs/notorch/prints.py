"""Prints a line per step to stdout, as most scripts report their progress: OUT STEPS. Under a
pipe or a file stdout is block-buffered, and the lines wait in Python's buffer."""

import sys

from pace import finish, progress


def main(steps: int) -> None:
    total = 0
    for step in range(1, steps + 1):
        total += step * step
        print(f"step {step} total {total}")
        progress(step)
    finish(total=total)


if __name__ == "__main__":
    main(int(sys.argv[2]))
