"""A streaming dataset as people write one for data that does not fit a map-style Dataset: an
IterableDataset that splits its shards between DataLoader workers with get_worker_info(), a
worker_init_fn that seeds numpy from the worker's torch seed (as the DataLoader docs advise),
per-sample noise and augmentation drawn from numpy's global generator in the workers, and an
epoch loop over it with SGD + momentum and an ExponentialLR.
usage: stream_workers.py OUT [--workers W] [--epochs N]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from common import finish, progress


class ShardStream(IterableDataset):
    def __init__(self, shards, per_shard, dim):
        super().__init__()
        self.shards, self.per_shard, self.dim = shards, per_shard, dim

    def _read_shard(self, shard):
        # A stand-in for reading a file: fixed content per shard, noise per read.
        g = np.random.default_rng(1000 + shard)
        x = g.standard_normal((self.per_shard, self.dim)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int64)
        return x, y

    def __iter__(self):
        info = get_worker_info()
        mine = range(self.shards) if info is None else range(info.id, self.shards, info.num_workers)
        for shard in mine:
            x, y = self._read_shard(shard)
            for i in np.random.permutation(len(x)):
                sample = x[i] + np.random.normal(0, 0.05, size=self.dim).astype(np.float32)
                yield torch.from_numpy(sample), int(y[i])


def worker_init_fn(worker_id):
    np.random.seed(torch.initial_seed() % 2 ** 32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out')
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--epochs', type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(11)
    np.random.seed(11)
    stream = ShardStream(shards=6, per_shard=40, dim=8)
    loader = DataLoader(stream, batch_size=16, num_workers=args.workers, worker_init_fn=worker_init_fn)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)

    losses, step = [], 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        scheduler.step()
        print(f"epoch {epoch}: {step} steps, last loss {losses[-1]:.4f}")

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), losses=losses)


if __name__ == '__main__':
    main()
