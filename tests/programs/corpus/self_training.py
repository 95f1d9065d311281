"""Self-training, as noisy-student scripts write it: a Dataset holds a tensor of pseudo-labels,
and at the end of every epoch the model relabels the whole unlabeled set into it
(`dataset.relabel(...)`), so each epoch trains on the labels the epoch before it made. The
DataLoader, made once before the epochs, shuffles, and with --workers N its workers load the
samples (each epoch's workers are forked when its iterator is made, with the labels as they are
then; --persistent workers, once, with the first epoch's). SGD with momentum, a StepLR.
usage: self_training.py OUT [--epochs N] [--workers N] [--persistent]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import finish, progress


class PseudoLabeled(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 5, generator=g)
        self.labels = (self.x.sum(1) > 0).long()  # the first epoch's: a rough rule

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.x[i], self.labels[i]

    @torch.no_grad()
    def relabel(self, model):
        self.labels = model(self.x).argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(41)
    dataset = PseudoLabeled(120, seed=42)
    loader = DataLoader(dataset, batch_size=10, shuffle=True, num_workers=args.workers, persistent_workers=args.persistent)
    model = nn.Sequential(nn.Linear(5, 24), nn.Tanh(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    step = 0

    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        scheduler.step()
        model.eval()
        dataset.relabel(model)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), labels=dataset.labels)


if __name__ == "__main__":
    main()
