"""Process-wide knobs turned once warm-up is over (epoch 2), each of which shapes the lines the later
epochs write to the log file, read back at the end: logging.disable(INFO), the script's logger set
to WARNING, torch.set_printoptions(precision=3) for the tensors the log prints, NumPy's print
precision.
usage: late_knobs.py OUT KNOB [--epochs N]"""
import argparse
import logging
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

log = logging.getLogger("train")


def turn(knob):
    if knob == "disable":
        logging.disable(logging.INFO)
    elif knob == "level":
        log.setLevel(logging.WARNING)
    elif knob == "torch-print":
        torch.set_printoptions(precision=3)
    elif knob == "numpy-print":
        np.set_printoptions(precision=2, suppress=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("knob", choices=["disable", "level", "torch-print", "numpy-print"])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    path = os.path.join(args.out, "train.log")
    logging.basicConfig(filename=path, level=logging.INFO, format="%(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    torch.manual_seed(61)
    x = torch.randn(120, 6)
    y = (x[:, 0] > x[:, 1]).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    for epoch in range(args.epochs):
        if epoch == 2:
            turn(args.knob)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            log.info("step %d loss %s", step, loss.detach())
            log.warning("step %d bias %s %s", step, model[2].bias.detach() * 1e-3, np.asarray(model[2].bias.detach()) * 1e-3)
            progress(step)
    logging.shutdown()
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
