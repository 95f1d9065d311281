"""An IterableDataset that reshuffles its own shard list and samples from `random.Random(seed +
epoch)`, told the epoch through `set_epoch` as streaming libraries do; a curriculum that grows the
sequence length with the epoch; a loop over the loader that breaks at --max-steps inside `while
True`, with a DataLoader made once in setup; and a learning-rate range test run first on a copy
of the model (deepcopy), its best rate then used for the real run.
usage: epoch_stream.py OUT [--max-steps N]"""
import argparse
import copy
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

from common import finish, progress


class Stream(IterableDataset):
    def __init__(self, shards, seed):
        self.shards, self.seed, self.epoch, self.length = shards, seed, 0, 4

    def set_epoch(self, epoch):
        self.epoch, self.length = epoch, min(4 + 2 * epoch, 12)

    def __iter__(self):
        rnd = random.Random(self.seed + self.epoch)
        shards = list(self.shards)
        rnd.shuffle(shards)
        for shard in shards:
            for _ in range(6):
                start = rnd.randrange(len(shard) - self.length)
                x = shard[start:start + self.length]
                yield x.mean(0), int(x[:, 0].sum() > 0)


def range_test(model, loader, lrs):
    probe = copy.deepcopy(model)
    best_lr, best_loss = lrs[0], float("inf")
    for lr, (x, y) in zip(lrs, loader):
        optimizer = torch.optim.SGD(probe.parameters(), lr=lr)
        loss = F.cross_entropy(probe(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < best_loss:
            best_lr, best_loss = lr, loss.item()
    return best_lr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-steps", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(17)
    shards = [torch.randn(40, 3) for _ in range(4)]
    data = Stream(shards, seed=100)
    loader = DataLoader(data, batch_size=4)
    model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
    lr = range_test(model, loader, [0.01, 0.03, 0.1, 0.3])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step, epoch, losses = 0, 0, []
    while True:
        data.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
            if step >= args.max_steps:
                break
        if step >= args.max_steps:
            break
        epoch += 1
    finish(model=model.state_dict(), lr=lr, losses=losses, epoch=epoch)


if __name__ == "__main__":
    main()
