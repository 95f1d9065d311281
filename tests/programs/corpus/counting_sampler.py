"""A custom Sampler that counts its own epochs: each __iter__ draws the permutation from a generator
seeded by the seed and its count, then counts one more (as samplers that need no set_epoch do),
with balanced classes by repeating the rarer one's indices. An MLP with SGD.
usage: counting_sampler.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, TensorDataset

from common import finish, progress


class BalancedSampler(Sampler):
    def __init__(self, labels, seed=0):
        self.labels = labels
        self.seed = seed
        self.epoch = 0

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        pos = torch.nonzero(self.labels == 1).flatten()
        neg = torch.nonzero(self.labels == 0).flatten()
        small, large = (pos, neg) if len(pos) < len(neg) else (neg, pos)
        repeated = small[torch.randint(len(small), (len(large),), generator=g)]
        both = torch.cat([large, repeated])
        return iter(both[torch.randperm(len(both), generator=g)].tolist())

    def __len__(self):
        counts = torch.bincount(self.labels, minlength=2)
        return 2 * int(counts.max())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(89)
    x = torch.randn(120, 6)
    y = (x[:, 0] > 0.7).long()
    sampler = BalancedSampler(y, seed=5)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), epochs=sampler.epoch)


if __name__ == "__main__":
    main()
