"""Counters and accumulators in main()'s locals and in module globals: OUT STEPS."""

import sys

from pace import finish, progress

seen = 0  # module globals, rebound every step
last_loss = None
totals = {"even": 0, "odd": 0}


def main(steps: int) -> None:
    global seen, last_loss
    loss_sum = 0.0
    best = float("inf")
    history = []
    tag = "start"
    for step in range(steps):
        loss = 1.0 / (step + 1) + (step % 7) * 0.125
        loss_sum += loss
        best = min(best, loss)
        history.append(round(loss_sum, 6))
        tag = f"step-{step}"
        totals["even" if step % 2 == 0 else "odd"] += step
        seen += 1
        last_loss = loss
        progress(step + 1)
    finish(loss_sum=loss_sum, best=best, history=history, tag=tag, seen=seen, last_loss=last_loss, totals=totals)


if __name__ == "__main__":
    main(int(sys.argv[2]))
