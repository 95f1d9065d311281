"""Phases of training inside `with` blocks that save state at entry and put it back at exit, as
careful scripts write them. Each epoch starts with a few re-warming steps on a small loader,
then trains on the full one; the schedule decays the rate per epoch, and the body's first layer
is unfrozen after the first epoch.
STYLE lr: the re-warm runs under `temporary_lr(optimizer, 1e-3)`, a generator context manager
  that saves each group's rate in its own frame and restores it at exit.
STYLE frozen: the re-warm trains the head alone under `Frozen(model.body)`, a class whose
  __enter__ saves the body's requires_grad flags on the instance and __exit__ puts them back.
STYLE fork_rng: the re-warm adds noise drawn inside `torch.random.fork_rng()`, which restores
  the global generator at exit, so the main phase draws as if it had not run.
usage: context_phases.py OUT STYLE [--epochs N]"""
import argparse
import contextlib
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


@contextlib.contextmanager
def temporary_lr(optimizer, lr):
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = lr
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, saved):
            group["lr"] = rate


class Frozen:
    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.saved = [p.requires_grad for p in self.module.parameters()]
        for p in self.module.parameters():
            p.requires_grad_(False)
        return self.module

    def __exit__(self, *exc):
        for p, flag in zip(self.module.parameters(), self.saved):
            p.requires_grad_(flag)
        return False


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("style", choices=["lr", "frozen", "fork_rng"])
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(21)
    x = torch.randn(192, 10)
    y = (x[:, :3].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    warm_loader = DataLoader(TensorDataset(x[:96], y[:96]), batch_size=8, shuffle=True)
    model = Net()
    for p in model.body[0].parameters():
        p.requires_grad_(False)  # the first layer waits for the first epoch's end
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.6)
    step, losses, rates = 0, [], []

    def train_on(xb, yb):
        nonlocal step
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        rates.append(optimizer.param_groups[0]["lr"])
        step += 1
        progress(step)

    for epoch in range(args.epochs):
        if args.style == "lr":
            with temporary_lr(optimizer, 1e-3):
                for xb, yb in itertools.islice(warm_loader, 7):
                    train_on(xb, yb)
        elif args.style == "frozen":
            with Frozen(model.body):
                for xb, yb in itertools.islice(warm_loader, 7):
                    train_on(xb, yb)
        else:
            with torch.random.fork_rng():
                for xb, yb in itertools.islice(warm_loader, 7):
                    train_on(xb + 0.1 * torch.randn_like(xb), yb)
        for xb, yb in loader:
            train_on(xb, yb)
        schedule.step()
        if epoch == 0:
            for p in model.body[0].parameters():
                p.requires_grad_(True)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, rates=rates)


if __name__ == "__main__":
    main()
