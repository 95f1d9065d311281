"""A metrics file opened in setup and written a line per step, never flushed by hand (Python's
buffer takes the lines to the file every 8 KiB), closed at the end and read back, as most scripts
write their logs. An MLP, Adam, a shuffled DataLoader.
usage: buffered_log.py OUT [--epochs N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    path = os.path.join(args.out, "metrics.txt")
    log = open(path, "w")
    log.write("step epoch loss\n")
    torch.manual_seed(29)
    x = torch.randn(192, 10)
    y = (x[:, 4:8].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            log.write(f"{step} {epoch} {loss.item():.6f}\n")
            progress(step)

    log.close()
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
