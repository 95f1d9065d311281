"""Semi-supervised training as FixMatch-style scripts write it: the unlabeled loader (shuffled,
smaller than the labeled one) is wrapped in `itertools.cycle` once, before training, and each
labeled batch takes the next unlabeled one with `next()`. cycle keeps every batch of the loader's
first pass and gives those same batches again, in the same order, once the loader runs out.
Pseudo-labels above a confidence threshold, weak and strong augmentation by noise, Adam.
usage: cycle_unlabeled.py OUT [--epochs N]"""
import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(91)
    x = torch.randn(192, 8)
    y = (x[:, 0] + x[:, 1] > 0).long()
    labeled = DataLoader(TensorDataset(x[:96], y[:96]), batch_size=8, shuffle=True)
    unlabeled = DataLoader(TensorDataset(x[96:160]), batch_size=16, shuffle=True)
    unlabeled_iter = itertools.cycle(unlabeled)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step, used = 0, 0

    for epoch in range(args.epochs):
        for xb, yb in labeled:
            (ub,) = next(unlabeled_iter)
            weak = ub + 0.05 * torch.randn_like(ub)
            strong = ub + 0.3 * torch.randn_like(ub)
            with torch.no_grad():
                probs = F.softmax(model(weak), dim=1)
                confidence, pseudo = probs.max(dim=1)
                mask = (confidence > 0.8).float()
            loss = F.cross_entropy(model(xb), yb) + (F.cross_entropy(model(strong), pseudo, reduction="none") * mask).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            used += int(mask.sum())
            step += 1
            progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), used=used)


if __name__ == "__main__":
    main()
