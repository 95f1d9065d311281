"""Progressive growing written recursively: `train(level)` trains the current network for a few
epochs, then, below the last level, widens it (a new, wider hidden layer whose first units copy
the old weights), makes a new optimizer, and calls `train(level + 1)`; each level returns its
losses up the stack, which sums them. A snapshot in a deeper level stands in several frames of
the same function.
usage: recursive_growth.py OUT [--levels N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

step = 0


def widen(model, width):
    old_in, old_out = model[0], model[2]
    new_in, new_out = nn.Linear(old_in.in_features, width), nn.Linear(width, old_out.out_features)
    with torch.no_grad():
        new_in.weight[: old_in.out_features] = old_in.weight
        new_in.bias[: old_in.out_features] = old_in.bias
        new_out.weight[:, : old_out.in_features] = old_out.weight
        new_out.bias.copy_(old_out.bias)
    return nn.Sequential(new_in, nn.Tanh(), new_out)


def train(model, loader, level, levels, epochs=2):
    global step
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3 / (level + 1))
    losses = []
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    if level + 1 < levels:
        deeper, below = train(widen(model, 8 * (level + 2)), loader, level + 1, levels)
        return deeper, [sum(losses)] + below
    return model, [sum(losses)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--levels", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(12)
    x = torch.randn(128, 5)
    y = torch.sin(2 * x[:, :1]) * x[:, 1:2]
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    model, sums = train(model, loader, 0, args.levels)
    finish(model=model.state_dict(), sums=sums)


if __name__ == "__main__":
    main()
