"""Batches from an iterator class of the script's own (`__iter__` returns self, `__next__` makes
the next batch from a random.Random it holds and counts its position), walked with
`for step, (x, y) in enumerate(stream)` until a step budget; a replay buffer of hard examples
the loop refills, and a warmup-then-linear learning rate set by hand in the param groups.
usage: custom_stream.py OUT [--steps N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class Stream:
    def __init__(self, seed, batch, dim):
        self.rng = random.Random(seed)
        self.batch, self.dim, self.position = batch, dim, 0
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(dim, generator=g)

    def __iter__(self):
        return self

    def __next__(self):
        self.position += 1
        g = torch.Generator().manual_seed(self.rng.getrandbits(32))
        x = torch.randn(self.batch, self.dim, generator=g)
        y = (x @ self.w + 0.1 * torch.randn(self.batch, generator=g) > 0).float()
        return x, y


def lr_at(step, warmup, total, peak):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (total - step) / (total - warmup))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()

    torch.manual_seed(5)
    stream = Stream(seed=11, batch=12, dim=16)
    model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0)
    hard = []  # the worst examples of recent batches, mixed back into the next ones
    losses = []
    for step, (x, y) in enumerate(stream):
        if hard:
            hx, hy = zip(*hard)
            x, y = torch.cat([x, torch.stack(hx)]), torch.cat([y, torch.stack(hy)])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, 10, args.steps, 3e-3)
        per_example = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y, reduction="none")
        loss = per_example.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        worst = per_example.detach().topk(2).indices
        hard = [(x[i], y[i]) for i in worst.tolist()]
        losses.append(loss.item())
        progress(step + 1)
        if step + 1 >= args.steps:
            break
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, position=stream.position)


if __name__ == "__main__":
    main()
