"""Multi-task training by sampling a task per step: one DataLoader per task, their iterators
kept in a dict and made again when one runs out, the task drawn with `random` in proportion to
its dataset size. A shared trunk with a head per task in a ModuleDict, Adam.
usage: multitask_iters.py OUT [--steps N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def task_data(n: int, k: int, generator: torch.Generator):
    x = torch.randn(n, 8, generator=generator)
    y = (x[:, k] > 0).long()
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=45)
    args = parser.parse_args()

    random.seed(7)
    torch.manual_seed(7)
    g = torch.Generator().manual_seed(7)
    sizes = {"a": 64, "b": 96, "c": 40}
    loaders = {name: DataLoader(task_data(n, i, g), batch_size=8, shuffle=True) for i, (name, n) in enumerate(sizes.items())}
    iterators = {name: iter(loader) for name, loader in loaders.items()}
    trunk = nn.Sequential(nn.Linear(8, 24), nn.ReLU())
    heads = nn.ModuleDict({name: nn.Linear(24, 2) for name in sizes})
    optimizer = torch.optim.Adam(list(trunk.parameters()) + list(heads.parameters()), lr=5e-3)
    names, weights = list(sizes), list(sizes.values())
    counts = {name: 0 for name in sizes}
    losses = []
    for step in range(args.steps):
        task = random.choices(names, weights=weights)[0]
        try:
            xb, yb = next(iterators[task])
        except StopIteration:
            iterators[task] = iter(loaders[task])
            xb, yb = next(iterators[task])
        optimizer.zero_grad()
        loss = F.cross_entropy(heads[task](trunk(xb)), yb)
        loss.backward()
        optimizer.step()
        counts[task] += 1
        losses.append((task, loss.item()))
        progress(step + 1)
    finish(trunk=trunk.state_dict(), heads=heads.state_dict(), optimizer=optimizer.state_dict(), counts=counts, losses=losses)


if __name__ == "__main__":
    main()
