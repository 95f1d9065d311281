"""Local functions made at a phase change (the second epoch) inside a nested `train()` that
rebinds main()'s locals through `nonlocal`, as scripts add things late: a probe hook that a
helper registers and returns from, appending to main()'s list (`probe`); a LambdaLR whose lambda
reads train()'s `warm` (`nested`); a `defaultdict(lambda: 0)` of label counts (`counts`); a
`functools.partial` over a local function that reads `warm` (`partial`).
usage: late_closures.py OUT MODE"""
import argparse
import collections
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def add_probe(layer, store):
    return layer.register_forward_hook(lambda m, i, out: store.append(round(out.abs().mean().item(), 6)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["probe", "nested", "counts", "partial"])
    args = parser.parse_args()
    torch.manual_seed(3)
    x = torch.randn(160, 6)
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    counts = None
    schedule = None
    weigh = None
    step = 0

    def train(epochs):
        nonlocal step, schedule, counts, weigh
        warm = 3
        for epoch in range(epochs):
            if epoch == 1:
                if args.mode == "probe":
                    add_probe(model[1], seen)
                elif args.mode == "nested":
                    schedule = LambdaLR(optimizer, lambda s: 1.0 / (1 + s // warm))
                elif args.mode == "counts":
                    counts = collections.defaultdict(lambda: 0)
                else:
                    def scaled(loss, factor):
                        return loss * factor * warm / 3
                    weigh = functools.partial(scaled, factor=0.5)
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                if weigh is not None:
                    loss = weigh(loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if schedule is not None:
                    schedule.step()
                if counts is not None:
                    for label in yb.tolist():
                        counts[label] += 1
                step += 1
                progress(step)

    train(5)
    finish(model=model.state_dict(), seen=seen, counts=dict(counts or {}), lr=optimizer.param_groups[0]["lr"])


if __name__ == "__main__":
    main()
