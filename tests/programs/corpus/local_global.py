"""A tracker of a class main() defines, put in a module global at epoch 1 (`global TRACKER`), with
a namedtuple of another local class as its last record; read by a module-level helper.
usage: local_global.py OUT [--epochs N]"""
import argparse
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

TRACKER = None


def note(loss):
    if TRACKER is not None:
        TRACKER.seen += 1
        TRACKER.total += loss
        TRACKER.last = TRACKER.Row(TRACKER.seen, round(TRACKER.total, 6))


def main():
    global TRACKER
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    Row = namedtuple("Row", "seen total")

    class Tracker:
        def __init__(self):
            self.seen, self.total, self.last, self.Row = 0, 0.0, None, Row

    torch.manual_seed(2)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    for epoch in range(args.epochs):
        if epoch == 1:
            TRACKER = Tracker()
        for _ in range(12):
            x = torch.randn(8, 4)
            loss = F.mse_loss(model(x), x[:, :1])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            note(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), last=tuple(TRACKER.last), seen=TRACKER.seen)


if __name__ == "__main__":
    main()
