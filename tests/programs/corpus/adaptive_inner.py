"""A data-dependent number of steps per batch: each batch is stepped on until its loss falls
under a target or five steps have passed, in a `while` loop inside the `for` over a shuffled
DataLoader. SGD with Nesterov momentum; the steps each batch took are kept.
usage: adaptive_inner.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(29)
    x = torch.randn(192, 6)
    y = torch.sin(x[:, :2].sum(dim=1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    total, per_batch = 0, []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            inner = 0
            loss = F.mse_loss(model(xb), yb)
            while loss.item() > 0.05 and inner < 5:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                inner += 1
                total += 1
                progress(total)
                loss = F.mse_loss(model(xb), yb)
            per_batch.append(inner)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), per_batch=per_batch)


if __name__ == "__main__":
    main()
