"""Reproducible streams drawn from one root seed, as NumPy's documentation recommends: a
`SeedSequence` spawns a child per epoch (its spawn counter moves on at each), each epoch's data
noise comes from a `Generator` over `Philox` of that child, augmentation from a long-lived
`Generator(SFC64)`, dropout masks from a `RandomState(MT19937)` kept for a legacy helper, and a
`torch.Generator` shuffles. Running metrics go to a `defaultdict` of bounded deques, the best
steps into a heap, each epoch's summary into a list of NamedTuples.
usage: seed_tree.py OUT [--epochs N]"""
import argparse
import heapq
from collections import defaultdict, deque
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class EpochSummary(NamedTuple):
    epoch: int
    mean_loss: float
    lr: float


def legacy_mask(rs, shape, keep):
    """An old helper that still takes a RandomState."""
    return torch.from_numpy((rs.random_sample(shape) < keep).astype(np.float32))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    root = np.random.SeedSequence(20261202)
    augment = np.random.Generator(np.random.SFC64(root.spawn(1)[0]))
    legacy = np.random.RandomState(np.random.MT19937(root.spawn(1)[0]))
    shuffle = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    base_x = torch.randn(96, 8)
    base_y = base_x @ torch.randn(8, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)

    smoothed = defaultdict(lambda: deque(maxlen=5))
    best = []  # (-loss, step): a max-heap of the five lowest losses
    summaries = []
    step = 0
    for epoch in range(args.epochs):
        noise = np.random.Generator(np.random.Philox(root.spawn(1)[0]))
        x = base_x + torch.from_numpy(noise.normal(0, 0.1, base_x.shape).astype(np.float32))
        order = torch.randperm(len(x), generator=shuffle)
        losses = []
        for i in range(args.steps):
            idx = order[(i * 8) % len(x):(i * 8) % len(x) + 8]
            xb = x[idx] * torch.from_numpy(augment.uniform(0.9, 1.1, (len(idx), 1)).astype(np.float32))
            hidden = model[1](model[0](xb)) * legacy_mask(legacy, (len(idx), 32), 0.9) / 0.9
            loss = F.mse_loss(model[2](hidden), base_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            smoothed["loss"].append(loss.item())
            smoothed["scale"].append(float(xb.abs().mean()))
            heapq.heappush(best, (-loss.item(), step))
            if len(best) > 5:
                heapq.heappop(best)
            losses.append(loss.item())
            progress(step)
        summaries.append(EpochSummary(epoch, sum(losses) / len(losses), scheduler.get_last_lr()[0]))
        scheduler.step()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), summaries=[tuple(s) for s in summaries],
           smoothed={k: list(v) for k, v in smoothed.items()}, best=sorted(best),
           spawned=root.n_children_spawned, legacy=legacy.random_sample(3).tolist(),
           augment=augment.random(3).tolist(), shuffle=shuffle.get_state())


if __name__ == "__main__":
    main()
