"""Seeded data: a numpy Generator and the `random` module feed a toy SGD (linear regression on
numpy arrays) through a python generator function; numpy's global RNG drops samples, a
`random.Random` jitters the weights: OUT EPOCHS BATCHES_PER_EPOCH."""

import random
import sys

import numpy as np

from pace import finish, progress

SEED = 1234
random.seed(SEED)
np.random.seed(SEED)
TRUE_W = np.array([1.5, -2.0, 0.25, 3.0])


def batches(rng: np.random.Generator, count: int, size: int = 16):
    """Fresh noisy samples each batch; the batch size varies by the `random` module."""
    for _ in range(count):
        n = size + random.randint(-4, 4)
        x = rng.standard_normal((n, TRUE_W.size))
        y = x @ TRUE_W + 0.1 * rng.standard_normal(n)
        yield x, y


def main() -> None:
    epochs, per_epoch = int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(SEED)
    jitter = random.Random(SEED + 1)
    w = np.zeros(TRUE_W.size)
    lr = 0.05
    losses = []
    step = 0
    for epoch in range(epochs):
        for x, y in batches(rng, per_epoch):
            keep = np.random.random(len(y)) > 0.1
            err = (x @ w - y) * keep
            w -= lr * (x.T @ err) / len(y)
            w += 1e-4 * jitter.gauss(0.0, 1.0)
            losses.append(float(err @ err / len(y)))
            step += 1
            progress(step)
        lr *= 0.9
    finish(w=w, losses=losses, lr=lr, draw=float(np.random.random()), next_random=random.random(), next_rng=rng.random())


if __name__ == "__main__":
    main()
