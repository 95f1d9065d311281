"""A loop that appends a line to a log at every step and rewrites a metrics file of NBYTES at its
first step and every EVERY steps after (an epoch's end): OUT STEPS [EVERY [NBYTES]]. The tests
and tools/bench_files.py measure what its files cost a snapshot."""

import os
import random
import sys

from pace import OUT, finish, progress


def metrics(epoch: int, nbytes: int) -> bytes:
    rows = random.Random(epoch)  # what an epoch's table of numbers looks like: different each epoch
    out = bytearray(b"epoch,step,loss,accuracy\n")
    while len(out) < nbytes:
        out += f"{epoch},{len(out)},{rows.random():.8f},{rows.random():.8f}\n".encode()
    return bytes(out[:nbytes])


def main(steps: int, every: int, nbytes: int) -> None:
    total = 0.0
    for step in range(steps):
        total += 1.0 / (step + 1)
        with open(os.path.join(OUT, "train.log"), "a") as log:
            log.write(f"step {step} total {total:.6f}\n")
        if step % every == 0:
            with open(os.path.join(OUT, "metrics.csv"), "wb") as f:
                f.write(metrics(step // every, nbytes))
        progress(step + 1)
    finish(total=total)


if __name__ == "__main__":
    main(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 10, int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 20)
