"""Activation statistics kept per module in a `weakref.WeakKeyDictionary` (so that a module
dropped later takes its entry with it), as stat collectors do: forward hooks registered in setup
add each layer's mean absolute output to its entry at every step. An MLP, SGD, a shuffled
DataLoader; the model and the statistics by layer name are the output.
usage: weak_stats.py OUT [--epochs N]"""
import argparse
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(17)
    x = torch.randn(160, 8)
    y = (x[:, 2:6].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    activity = weakref.WeakKeyDictionary()

    def record(module, inputs, output):
        activity[module] = activity.get(module, 0.0) + output.detach().abs().mean().item()

    for layer in model:
        if isinstance(layer, nn.ReLU):
            layer.register_forward_hook(record)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    stats = {name: round(activity[m], 6) for name, m in model.named_modules() if m in activity}
    finish(model=model.state_dict(), stats=stats)


if __name__ == "__main__":
    main()
