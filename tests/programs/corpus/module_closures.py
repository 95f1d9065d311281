"""A script written at module level whose helpers keep state in closures: a step counter made by
a factory (`tick = make_counter()`, `nonlocal n`) that switches the loss to label smoothing at
step 25, an exponential moving average of the loss kept by another closure, and an evaluation
function under @torch.no_grad() (a decorated function: a closure over the original).
usage: module_closures.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def make_counter():
    n = 0

    def tick():
        nonlocal n
        n += 1
        return n
    return tick


def make_ema(beta=0.9):
    value = None

    def update(x):
        nonlocal value
        value = x if value is None else beta * value + (1 - beta) * x
        return value
    return update


@torch.no_grad()
def evaluate(model, x, y):
    return F.cross_entropy(model(x), y).item()


parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(4)
x = torch.randn(160, 8)
y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tick, smooth = make_counter(), make_ema()
history = []
step = 0
for epoch in range(args.epochs):
    for xb, yb in loader:
        n = tick()
        loss = F.cross_entropy(model(xb), yb, label_smoothing=0.2 if n > 25 else 0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(smooth(loss.item()))
        step += 1
        progress(step)
    history.append(evaluate(model, x, y))

finish(model=model.state_dict(), history=history, ticks=tick())
