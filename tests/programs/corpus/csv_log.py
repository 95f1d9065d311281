"""Each step's loss written as a CSV row through csv.writer over a file kept open, as scripts
that log with the csv module do; the file is read back at the end. --lazy makes the file and the
writer at the first step (a logger that opens on first use), --dict uses a DictWriter. An MLP,
SGD with momentum, a shuffled DataLoader.
usage: csv_log.py OUT [--epochs N] [--lazy] [--dict]"""
import argparse
import csv
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def open_log(path, as_dict):
    f = open(path, "w", newline="")
    if as_dict:
        writer = csv.DictWriter(f, fieldnames=["step", "epoch", "loss"])
        writer.writeheader()
    else:
        writer = csv.writer(f)
        writer.writerow(["step", "epoch", "loss"])
    return f, writer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lazy", action="store_true")
    parser.add_argument("--dict", action="store_true")
    args = parser.parse_args()

    path = os.path.join(args.out, "log.csv")
    f, writer = (None, None) if args.lazy else open_log(path, args.dict)
    torch.manual_seed(43)
    x = torch.randn(192, 10)
    y = (x[:, 0:4].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if writer is None:
                f, writer = open_log(path, args.dict)
            row = {"step": step, "epoch": epoch, "loss": f"{loss.item():.6f}"}
            writer.writerow(row if args.dict else list(row.values()))
            progress(step)

    f.close()
    with open(path, newline="") as g:
        rows = list(csv.reader(g))
    finish(model=model.state_dict(), rows=rows)


if __name__ == "__main__":
    main()
