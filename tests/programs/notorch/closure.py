"""A closure cell rebound with ``nonlocal`` every step: main()'s cells, seen from the step loop's
frame as free variables (restore must write the cells, not a copy): OUT STEPS."""

import sys

from pace import finish, progress


def main(steps: int) -> None:
    total = 0
    trail = ()

    def record(value: int) -> None:
        nonlocal total, trail
        total += value
        trail = trail + (value,)

    def run() -> int:
        nonlocal total
        done = 0
        for step in range(steps):
            record(step * step % 11)
            if step % 5 == 4:
                total -= 3  # the step loop's frame rebinds the cell too
            done += 1
            progress(step + 1)
        return done

    done = run()
    finish(total=total, trail=list(trail), done=done)


if __name__ == "__main__":
    main(int(sys.argv[2]))
