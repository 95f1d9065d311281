"""A metrics log written through a raw descriptor: `os.open` in setup (appending, or truncating
with --trunc, where each `os.write` moves the descriptor's offset on), one line per step, read
back at the end.
usage: raw_fd_log.py OUT [--trunc] [--epochs N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trunc", action="store_true")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    path = os.path.join(args.out, "metrics.log")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.trunc else os.O_APPEND)
    fd = os.open(path, flags, 0o644)
    torch.manual_seed(2)
    x, y = torch.randn(96, 6), torch.randn(96, 1)
    model = nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    for epoch in range(args.epochs):
        for i in range(0, 96, 8):
            loss = F.mse_loss(model(x[i:i + 8]), y[i:i + 8])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            os.write(fd, f"{epoch} {step} {loss.item():.6f}\n".encode())
            progress(step)
    os.close(fd)
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
