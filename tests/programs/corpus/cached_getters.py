"""State held only by a cached getter: `functools.lru_cache`'s or `functools.cache`'s function
returns one object for good, and the program changes that object as it trains. Class weights
made on first use and reweighted in place at each epoch's end from the per-class errors
(`weights`), or counters kept in a singleton the getter makes (`counter`; the program reports
them with its final state), or the same counters from a getter `main()` defines for itself
(`local`). `--first-use setup` calls the getter once before the loop, as a
warm-up would; `step` (the default) only in the loop.
usage: cached_getters.py OUT MODE [--epochs N] [--first-use setup|step]"""
import argparse
import collections
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

CLASSES = 5


@functools.lru_cache(maxsize=None)
def class_weights(n):
    return torch.ones(n)


@functools.cache
def stats():
    return collections.Counter()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["weights", "counter", "local"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--first-use", choices=["setup", "step"], default="step")
    args = parser.parse_args()

    @functools.lru_cache(maxsize=None)
    def local_stats():
        return collections.Counter()

    counters = local_stats if args.mode == "local" else stats

    torch.manual_seed(16)
    x = torch.randn(160, 24)
    y = (x[:, :CLASSES] + 0.5 * torch.randn(160, CLASSES)).argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.first_use == "setup":
        class_weights(CLASSES)
        counters()
    step = 0
    for epoch in range(args.epochs):
        wrong = torch.zeros(CLASSES)
        for xb, yb in loader:
            out = model(xb)
            weight = class_weights(CLASSES) if args.mode == "weights" else None
            loss = F.cross_entropy(out, yb, weight=weight)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            wrong += torch.bincount(yb[out.argmax(1) != yb], minlength=CLASSES).float()
            counts = counters()
            counts["seen"] += len(yb)
            counts["wrong"] += int((out.argmax(1) != yb).sum())
            step += 1
            progress(step)
        if args.mode == "weights":
            class_weights(CLASSES).mul_(0.5).add_(0.5 * (1 + wrong / wrong.sum().clamp(min=1)))
    finish(model=model.state_dict(), weights=class_weights(CLASSES).clone(), stats=dict(counters()))


if __name__ == "__main__":
    main()
