"""A script whose helpers live in a module of its own folder (train_utils.py) and keep their state
there: the global step every schedule reads (`train_utils.GLOBAL_STEP`, bumped through
`global`), the metrics recorded per step in a module dict, and a cache of learning-rate factors.
The script reads the step only through the module, so nothing of it is in the script's own
frames or globals.
usage: module_helpers.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import train_utils
from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(12)
    x = torch.randn(96, 5)
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for epoch in range(args.epochs):
        for xb, yb in loader:
            for group in optimizer.param_groups:
                group["lr"] = 0.2 * train_utils.lr_factor(train_utils.GLOBAL_STEP)
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_utils.record("loss", loss.item())
            progress(train_utils.bump())
    finish(model=model.state_dict(), step=train_utils.GLOBAL_STEP, metrics=train_utils.METRICS)


if __name__ == "__main__":
    main()
