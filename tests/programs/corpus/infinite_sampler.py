"""An iteration-based trainer in detectron2's style: an infinite training sampler (a generator
over torch.randperm from its own seeded torch.Generator, epoch after epoch), a DataLoader made
once in setup over it with a collate function that keeps the list of dicts, its iterator taken
with `iter()` in setup and advanced by `next()` each iteration of `for iteration in
range(start_iter, max_iter)`, a WarmupMultiStepLR-like LambdaLR, and periodic evaluation.
usage: infinite_sampler.py OUT [--max-iter N] [--workers W]"""
import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from common import finish, progress


class TrainingSampler(Sampler):
    def __init__(self, size, shuffle=True, seed=0):
        self._size, self._shuffle, self._seed = size, shuffle, seed

    def __iter__(self):
        yield from itertools.islice(self._infinite_indices(), 0, None)

    def _infinite_indices(self):
        g = torch.Generator()
        g.manual_seed(self._seed)
        while True:
            if self._shuffle:
                yield from torch.randperm(self._size, generator=g).tolist()
            else:
                yield from range(self._size)


class Records(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] * self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": int(self.y[i]), "id": i}


def trivial_batch_collator(batch):
    return batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(97)
    dataset = Records(50)
    loader = DataLoader(dataset, batch_size=8, sampler=TrainingSampler(len(dataset), seed=11),
                        collate_fn=trivial_batch_collator, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warmup, steps = 10, (30, 45)

    def factor(it):
        alpha = min(1.0, (it + 1) / warmup)
        return (0.1 + 0.9 * alpha) * 0.1 ** sum(it >= s for s in steps)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    data_loader_iter = iter(loader)
    seen, evals = [], []
    start_iter = 0
    for iteration in range(start_iter, args.max_iter):
        data = next(data_loader_iter)
        x = torch.stack([d["image"] for d in data])
        y = torch.tensor([d["label"] for d in data])
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        seen.append([d["id"] for d in data])
        if (iteration + 1) % 20 == 0:
            with torch.no_grad():
                evals.append(F.cross_entropy(model(dataset.x), dataset.y).item())
        progress(iteration + 1)
    finish(model=model.state_dict(), seen=seen, evals=evals)


if __name__ == "__main__":
    main()
