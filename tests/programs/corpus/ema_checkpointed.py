"""A transformer-ish block stack trained the way memory-tight scripts do: activation checkpointing
(torch.utils.checkpoint, non-reentrant, dropout inside, so the recomputation must replay the RNG),
bfloat16 autocast, gradient accumulation over 4 micro-batches, SequentialLR (linear warmup, then
cosine), an EMA of the weights kept by swa_utils.AveragedModel with get_ema_multi_avg_fn, and a
random_split of the data with a seeded generator, the training half shuffled by the global RNG.
usage: ema_checkpointed.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset, random_split

from common import finish, progress


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(width), nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.1),
                                                                nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, width=24, depth=3):
        super().__init__()
        self.embed, self.blocks, self.head = nn.Linear(10, width), nn.ModuleList(Block(width) for _ in range(depth)), nn.Linear(width, 3)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False)
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(5)
    x = torch.randn(200, 10)
    data = TensorDataset(x, (x[:, 0] * 2 + x[:, 1] > x[:, 2]).long() + (x[:, 3] > 1).long())
    train, val = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(6))
    loader = DataLoader(train, batch_size=8, shuffle=True, drop_last=True)

    model = Net()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.95))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    accumulate = 4
    updates = args.epochs * len(loader) // accumulate
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=3),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=updates - 3)], milestones=[3])
    step = 0
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(xb), yb) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                ema.update_parameters(model)
            step += 1
            progress(step)
    with torch.no_grad():
        xv, yv = val[:]
        val_loss = F.cross_entropy(ema(xv), yv).item()
    finish(model=model.state_dict(), ema=ema.state_dict(), optimizer=optimizer.state_dict(),
           scheduler=scheduler.state_dict(), val_loss=val_loss)


if __name__ == "__main__":
    main()
