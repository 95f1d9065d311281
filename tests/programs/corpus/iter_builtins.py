"""A step loop over a DataLoader seen through Python's own iterator tools, as scripts write them
without a second thought: `map(to_device, loader)`, `filter(is_full, loader)` to drop the short
last batch, `itertools.chain(clean_loader, noisy_loader)` for an epoch over two datasets, a
generator expression that scales each batch, `itertools.zip_longest` over two loaders of other
lengths, and a `for ... else` whose `else` counts the epochs that ran to their end (a step cap
per epoch breaks out of the others) and decays the rate only then. AdamW, shuffled loaders.
usage: iter_builtins.py OUT STYLE [--epochs N]
STYLE: map | filter | chain | genexpr | zip_longest | for_else"""
import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def to_device(batch):
    x, y = batch
    return x.float(), y.float()


def is_full(batch):
    return len(batch[0]) == 8


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("style", choices=["map", "filter", "chain", "genexpr", "zip_longest", "for_else"])
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(7)
    x = torch.randn(100, 6, dtype=torch.float64)
    y = x[:, :3].sum(dim=1, keepdim=True) + 0.1 * torch.randn(100, 1, dtype=torch.float64)
    clean = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    noisy = DataLoader(TensorDataset(x[:40] + 0.3 * torch.randn(40, 6, dtype=torch.float64), y[:40]),
                       batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    step, losses, completed, cap = 0, [], 0, 11

    def train_on(xb, yb):
        nonlocal step
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        progress(step)

    for epoch in range(args.epochs):
        if args.style == "map":
            for xb, yb in map(to_device, clean):
                train_on(xb, yb)
        elif args.style == "filter":
            for xb, yb in filter(is_full, map(to_device, clean)):
                train_on(xb, yb)
        elif args.style == "chain":
            for xb, yb in itertools.chain(noisy, clean):
                train_on(xb.float(), yb.float())
        elif args.style == "genexpr":
            for xb, yb in ((xb.float() * 0.5, yb.float() * 0.5) for xb, yb in clean):
                train_on(xb, yb)
        elif args.style == "zip_longest":
            for a, b in itertools.zip_longest(clean, noisy):
                xb, yb = a if b is None else (torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]))
                train_on(xb.float(), yb.float())
        else:
            cap = 11 if epoch % 2 else 20  # odd epochs stop early
            for i, (xb, yb) in enumerate(clean):
                if i >= cap:
                    break
                train_on(xb.float(), yb.float())
            else:
                completed += 1
                for group in optimizer.param_groups:
                    group["lr"] *= 0.7
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, completed=completed)


if __name__ == "__main__":
    main()
