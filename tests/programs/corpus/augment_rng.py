"""Augmentation drawn from a generator the dataset keeps itself: a map-style Dataset whose
random crop offset and noise come from ``self.rng``, a numpy Generator that worker_init_fn makes
in each DataLoader worker from the worker's seed (the DataLoader docs' advice for numpy, kept on
the worker's copy of the dataset instead of numpy's global state), a shuffled loader with two
workers (forked, or started with --context spawn; kept from epoch to epoch with --persistent, so
their generators go on where the last epoch left them), and Adam with a cosine schedule stepped
per batch. usage: augment_rng.py OUT [--workers W] [--epochs N] [--context fork|spawn] [--persistent]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

from common import finish, progress


class Jittered(Dataset):
    def __init__(self, n, length, dim):
        g = np.random.default_rng(5)
        self.series = g.standard_normal((n, length + 4)).astype(np.float32)
        self.labels = (self.series[:, :dim].sum(axis=1) > 0).astype(np.int64)
        self.dim = dim
        self.rng = np.random.default_rng(0)  # replaced in each worker by seed_worker

    def __len__(self):
        return len(self.series)

    def __getitem__(self, i):
        start = int(self.rng.integers(0, 5))
        window = self.series[i, start:start + self.dim] + self.rng.normal(0, 0.05, self.dim).astype(np.float32)
        return torch.from_numpy(window), int(self.labels[i])


def seed_worker(worker_id):
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out')
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--context', default=None)
    parser.add_argument('--persistent', action='store_true', help='persistent_workers=True')
    args = parser.parse_args()

    torch.manual_seed(3)
    data = Jittered(n=192, length=12, dim=12)
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=args.workers, worker_init_fn=seed_worker,
                        multiprocessing_context=args.context, persistent_workers=args.persistent)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))

    losses, step = [], 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        print(f"epoch {epoch}: {step} steps, last loss {losses[-1]:.4f}")

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), losses=losses)


if __name__ == '__main__':
    main()
