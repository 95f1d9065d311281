"""Training written with closures, as people do who come from functional code: a factory builds
the optimizer and schedule inside itself and returns a `train_step` closure that owns them (and
a running loss kept with `nonlocal`), a batch sampler closure owns its torch.Generator, and the
loss is a functools.partial. Nothing but the closures holds the optimizer, its schedule or the
data generator.
usage: closures.py OUT [--steps N]"""
import argparse
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def make_sampler(n_features, batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(n_features, 1, generator=gen)

    def sample():
        x = torch.randn(batch_size, n_features, generator=gen)
        return x, x @ teacher + 0.1 * torch.randn(batch_size, 1, generator=gen)

    return sample


def make_train_step(model, loss_fn, lr, total_steps):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    running = None

    def train_step(batch):
        nonlocal running
        x, y = batch
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        return loss.item()

    def state():
        return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "running": running}

    return train_step, state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    loss_fn = functools.partial(F.smooth_l1_loss, beta=0.5)
    sample = make_sampler(12, 16, seed=5)
    train_step, train_state = make_train_step(model, loss_fn, lr=5e-3, total_steps=args.steps)

    losses = []
    for step in range(args.steps):
        losses.append(train_step(sample()))
        progress(step + 1)

    finish(model=model.state_dict(), losses=losses, next_batch=sample(), **train_state())


if __name__ == "__main__":
    main()
