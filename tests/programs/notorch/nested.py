"""The loop inside nested frames: main -> train -> epoch loop -> run_epoch -> step loop, with
locals carried across iterations in each frame: OUT EPOCHS STEPS_PER_EPOCH."""

import sys

from pace import finish, progress


def run_epoch(epoch: int, steps: int, weight: float, done: int) -> tuple[float, float, int]:
    running = 0.0
    momentum = 0.0
    for step in range(steps):
        grad = weight - (epoch + 1) * 0.5 + step * 0.01
        momentum = 0.9 * momentum + grad
        weight -= 0.05 * momentum
        running += grad * grad
        done += 1
        progress(done)
    return weight, running / steps, done


def train(epochs: int, steps: int) -> dict:
    weight = 3.0
    losses = []
    best_epoch = -1
    best = float("inf")
    done = 0
    for epoch in range(epochs):
        weight, loss, done = run_epoch(epoch, steps, weight, done)
        losses.append(loss)
        if loss < best:
            best, best_epoch = loss, epoch
    return {"weight": weight, "losses": losses, "best": best, "best_epoch": best_epoch, "done": done}


def main() -> None:
    epochs, steps = int(sys.argv[2]), int(sys.argv[3])
    result = train(epochs, steps)
    finish(**result)


if __name__ == "__main__":
    main()
