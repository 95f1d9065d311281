"""Things that happen every few steps, past what a restart's first iterations show: mixup with a
numpy Beta draw each step, a validation pass every 7 steps over a shuffled loader (its iterator
draws from the global generator, which the next training epoch's shuffle then follows), the best
model so far kept as a deepcopy of its state_dict, the learning rate halved when the moving
average of the last 5 validation losses (a deque) stops improving, and a curriculum list
reshuffled with `random.shuffle` at each epoch's start.
usage: periodic_eval.py OUT [--epochs N]"""
import argparse
import copy
import random
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    return TensorDataset(x, y)


def evaluate(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x), y, reduction="sum").item()
            count += len(y)
    model.train()
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    random.seed(81)
    np.random.seed(82)
    torch.manual_seed(83)
    train = DataLoader(make_data(160, 1), batch_size=16, shuffle=True)
    val = DataLoader(make_data(48, 2), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    curriculum = [0.0, 0.1, 0.2, 0.3]
    recent, best_loss, best_state = deque(maxlen=5), float("inf"), None
    last_average, halvings, step = float("inf"), 0, 0

    for epoch in range(args.epochs):
        random.shuffle(curriculum)
        noise = curriculum[0]
        for x, y in train:
            lam = float(np.random.beta(0.4, 0.4))
            order = torch.randperm(len(y))
            mixed = lam * x + (1 - lam) * x[order] + noise * torch.randn_like(x)
            out = model(mixed)
            loss = lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[order])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 7 == 0:
                val_loss = evaluate(model, val)
                recent.append(val_loss)
                if val_loss < best_loss:
                    best_loss, best_state = val_loss, copy.deepcopy(model.state_dict())
                average = sum(recent) / len(recent)
                if len(recent) == recent.maxlen and average > last_average:
                    for group in optimizer.param_groups:
                        group["lr"] *= 0.5
                    halvings += 1
                last_average = average
            progress(step)

    finish(model=model.state_dict(), best=best_state, best_loss=best_loss, halvings=halvings,
           recent=list(recent), curriculum=curriculum, lr=optimizer.param_groups[0]["lr"])


if __name__ == "__main__":
    main()
