"""A learning-rate range test before training, as fastai's lr_find does it by hand: the model
trains a few steps with an exponentially growing rate, the losses are recorded, the weights go
back to where they started, and the real training uses a tenth of the rate where the loss fell
fastest, with a OneCycleLR over its epochs.
usage: lr_finder.py OUT [--epochs N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def find_lr(model, loader, start=1e-4, end=1.0, steps=12):
    initial = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=start, momentum=0.9)
    gamma = (end / start) ** (1 / (steps - 1))
    lrs, losses = [], []
    batches = iter(loader)
    for i in range(steps):
        xb, yb = next(batches)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        lrs.append(optimizer.param_groups[0]["lr"])
        losses.append(loss.item())
        for group in optimizer.param_groups:
            group["lr"] *= gamma
        progress(i + 1)  # (the harness counts every stepping iteration, as gpusnap does)
    model.load_state_dict(initial)
    slopes = [losses[i + 1] - losses[i] for i in range(len(losses) - 1)]
    return lrs[min(range(len(slopes)), key=slopes.__getitem__)] / 10


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(53)
    x = torch.randn(384, 10)
    y = (x[:, :3].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    lr = find_lr(model, loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr * 10, total_steps=args.epochs * len(loader))
    step, losses = 12, []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), lr=lr, losses=losses)


if __name__ == "__main__":
    main()
