"""Each epoch seeded from the epoch's number, as scripts that want an epoch to be repeatable on
its own do: `torch.manual_seed(seed + epoch)`, `random.seed(...)`, `np.random.seed(...)` at the top
of the epoch; the shard files shuffled with `random.shuffle`, each shard's rows in an order NumPy
draws, batches cut by hand, dropout, gradient clipping, OneCycleLR stepped per batch, and early
stopping on a validation loss with the best weights kept as clones.
usage: reseed_epochs.py OUT [--epochs N]"""
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def make_shards(n_shards, rows, seed):
    g = torch.Generator().manual_seed(seed)
    shards = []
    for _ in range(n_shards):
        x = torch.randn(rows, 10, generator=g)
        y = (x[:, :3].sum(1, keepdim=True) > 0).float()
        shards.append((x, y))
    return shards


def batches(shard, size):
    x, y = shard
    order = np.random.permutation(len(x))
    for start in range(0, len(x) - size + 1, size):
        idx = torch.from_numpy(order[start:start + size])
        yield x[idx], y[idx]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    shards = make_shards(4, 24, args.seed)
    val_x, val_y = make_shards(1, 64, args.seed + 1)[0]
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps_per_epoch = len(shards) * (24 // 6)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=args.epochs * steps_per_epoch)

    best, best_state, bad, patience = float("inf"), None, 0, 3
    history, step = [], 0
    for epoch in range(args.epochs):
        torch.manual_seed(args.seed + epoch)
        random.seed(args.seed * 100 + epoch)
        np.random.seed(args.seed * 1000 + epoch)
        order = list(range(len(shards)))
        random.shuffle(order)
        model.train()
        for shard_index in order:
            for x, y in batches(shards[shard_index], 6):
                loss = F.binary_cross_entropy_with_logits(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                history.append(loss.item())
                step += 1
                progress(step)
        model.eval()
        with torch.no_grad():
            val = F.binary_cross_entropy_with_logits(model(val_x), val_y).item()
        if val < best - 1e-4:
            best, bad = val, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad >= patience:
                break
    model.load_state_dict(best_state)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
           history=history, best=best, epoch=epoch)


if __name__ == "__main__":
    main()
