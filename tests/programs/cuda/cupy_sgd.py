"""Linear regression by SGD in CuPy arrays on the GPU (no torch): OUT STEPS."""

import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notorch"))
from pace import finish, progress  # noqa: E402


def main(steps: int) -> None:
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((4096, 256), dtype=cp.float32)
    true_w = rng.standard_normal(256, dtype=cp.float32)
    y = x @ true_w
    w = cp.zeros(256, dtype=cp.float32)
    history = []
    for step in range(steps):
        rows = slice((step * 64) % 4096, (step * 64) % 4096 + 64)
        grad = x[rows].T @ (x[rows] @ w - y[rows]) / 64
        w -= 0.01 * grad
        if step % 10 == 0:
            history.append(float(cp.linalg.norm(w - true_w)))
        progress(step + 1)
    finish(w=cp.asnumpy(w).tobytes().hex(), history=history)


if __name__ == "__main__":
    main(int(sys.argv[2]))
