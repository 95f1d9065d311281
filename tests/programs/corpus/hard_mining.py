"""Hard-example mining, as scripts that resample their data each epoch write it: every epoch
draws a random subset of the dataset (`torch.randperm`), weights it by the per-sample losses the
last epoch recorded, and makes a new DataLoader over a `Subset` with a `WeightedRandomSampler`,
inside the epoch loop. The dataset yields each sample's index, and the loss of every sample seen
is written back into a tensor of all of them. Adagrad, label smoothing. With --online, each
step also writes its losses into the sampler's weights, in place, as they come.
usage: hard_mining.py OUT [--epochs N] [--online]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset, WeightedRandomSampler

from common import finish, progress


class Indexed(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] * self.x[:, 1] > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--online", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(111)
    dataset = Indexed(200, seed=112)
    losses = torch.ones(len(dataset))
    model = nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    step = 0

    for epoch in range(args.epochs):
        subset = torch.randperm(len(dataset))[:96]
        sampler = WeightedRandomSampler(losses[subset] + 0.1, num_samples=len(subset), replacement=True)
        loader = DataLoader(Subset(dataset, subset.tolist()), batch_size=8, sampler=sampler)
        position = {index: k for k, index in enumerate(subset.tolist())}
        for x, y, index in loader:
            per_sample = F.cross_entropy(model(x), y, reduction="none", label_smoothing=0.1)
            optimizer.zero_grad()
            per_sample.mean().backward()
            optimizer.step()
            losses[index] = per_sample.detach()
            if args.online:
                sampler.weights[[position[i] for i in index.tolist()]] = per_sample.detach().double() + 0.1
            step += 1
            progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
