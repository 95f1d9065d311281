"""A model of lazy modules whose input sizes come from the first batch (LazyConv1d, LazyLinear,
LazyBatchNorm1d): the optimizer is made before any forward, so the parameters are materialized,
and the modules become Conv1d, Linear and BatchNorm1d, inside the first training step. AdamW with
a OneCycleLR schedule; sequences from a DataLoader with a collate function that pads by hand.
usage: lazy_modules.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common import finish, progress


def make_data(n, generator):
    lengths = torch.randint(6, 14, (n,), generator=generator)
    return [(torch.randn(3, int(t), generator=generator), int(t) % 4) for t in lengths]


def pad(batch):
    longest = max(x.shape[1] for x, _ in batch)
    xs = torch.stack([F.pad(x, (0, longest - x.shape[1])) for x, _ in batch])
    return xs, torch.tensor([y for _, y in batch])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(13)
    data = make_data(256, torch.Generator().manual_seed(2))
    loader = DataLoader(data, batch_size=16, shuffle=True, collate_fn=pad, drop_last=True)
    model = nn.Sequential(
        nn.LazyConv1d(16, 3, padding=1), nn.LazyBatchNorm1d(), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.LazyLinear(4),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=args.steps)
    step, losses = 0, []
    while step < args.steps:
        for xs, ys in loader:
            loss = F.cross_entropy(model(xs), ys)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            losses.append(loss.item())
            progress(step)
            if step == args.steps:
                break
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses,
           kinds=[type(m).__name__ for m in model])


if __name__ == "__main__":
    main()
