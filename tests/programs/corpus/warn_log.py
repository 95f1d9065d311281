"""Warnings routed into the run's log (logging.captureWarnings), as scripts that keep one log do:
the program warns each epoch its learning rate falls under a floor (once per place, Python's
default), and a DataFrame of the epoch's metrics is logged with pandas' display precision lowered
once warm-up is over.
usage: warn_log.py OUT [--epochs N] [--pandas]"""
import argparse
import logging
import os
import warnings

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--pandas", action="store_true")
    args = parser.parse_args()
    path = os.path.join(args.out, "run.log")
    logging.basicConfig(filename=path, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.captureWarnings(True)
    log = logging.getLogger("train")
    torch.manual_seed(71)
    x = torch.randn(100, 5)
    y = (x[:, 0] - x[:, 2] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    model = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    step = 0
    for epoch in range(args.epochs):
        if args.pandas and epoch == 2:
            pd.set_option("display.precision", 3)
        rows = []
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows.append({"step": step, "loss": loss.item()})
            step += 1
            progress(step)
        scheduler.step()
        lr = scheduler.get_last_lr()[0]
        if lr < 0.05:
            warnings.warn(f"learning rate {lr} is under 0.05")
        log.info("epoch %d\n%s", epoch, pd.DataFrame(rows).describe().loc[["mean", "min", "max"]])
    logging.shutdown()
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
