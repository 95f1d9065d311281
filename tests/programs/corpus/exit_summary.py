"""A CSV logger made at the first step that logs, which registers its close() with atexit, as
loggers that must not lose their tail do; close() writes a summary line. The script never closes
it: the line is written as the interpreter exits, and a second process reads the file (the
harness compares OUT/summary.csv too). --lambda registers `lambda: self.close()` instead, which
a snapshot cannot hold. An MLP, Adam, a shuffled DataLoader.
usage: exit_summary.py OUT [--epochs N] [--lambda]"""
import argparse
import atexit
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class CSVLogger:
    def __init__(self, path, by_lambda=False):
        self.file = open(path, "w")
        self.rows = 0
        self.file.write("step,loss\n")
        atexit.register((lambda: self.close()) if by_lambda else self.close)

    def log(self, step, loss):
        self.file.write(f"{step},{loss:.6f}\n")
        self.rows += 1

    def close(self):
        self.file.write(f"# {self.rows} rows\n")
        self.file.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lambda", dest="by_lambda", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(37)
    x = torch.randn(192, 10)
    y = (x[:, 2:6].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    logger = None

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if logger is None:
                logger = CSVLogger(os.path.join(args.out, "summary.csv"), args.by_lambda)
            logger.log(step, loss.item())
            progress(step)

    finish(model=model.state_dict())


if __name__ == "__main__":
    main()
