"""State that lives only where pickle cannot name it: a running average made by a factory whose
frame has returned (its history, count and random.Random are closure cells of the returned
function), and a tracker whose class, with slots, is defined inside main(): OUT STEPS."""

import random
import sys

from pace import finish, progress


def make_averager(seed: int):
    history = []
    count = 0
    noise = random.Random(seed)

    def update(value: float) -> float:
        nonlocal count
        count += 1
        history.append(value + noise.random())
        return sum(history) / count

    return update


def main(steps: int) -> None:
    class Best:
        __slots__ = ("value", "step")

        def __init__(self):
            self.value, self.step = float("-inf"), -1

    average = make_averager(7)
    best = Best()
    for step in range(steps):
        mean = average(step % 13)
        if mean > best.value:
            best.value, best.step = mean, step
        progress(step + 1)
    finish(mean=average(0.0), best=[best.value, best.step])


if __name__ == "__main__":
    main(int(sys.argv[2]))
