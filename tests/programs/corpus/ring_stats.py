"""A loss-normalized schedule over a ring buffer of recent losses, as scripts that adapt the
learning rate to the loss's noise do: the buffer is allocated in setup, a view of its second half
(`recent`) is taken when the warm-up ends, and each step writes its loss into the buffer and
scales the rate by the view's spread.
usage: ring_stats.py OUT [--epochs N] [--warmup N]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(9)
    x = torch.randn(192, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(192, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ring = np.zeros(16)
    recent = None
    step, losses = 0, []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            if recent is not None:
                for group in optimizer.param_groups:
                    group["lr"] = 0.05 / (1.0 + 10.0 * float(recent.std()))
            optimizer.step()
            ring[step % len(ring)] = loss.item()
            if step == args.warmup:
                recent = ring[8:]
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
