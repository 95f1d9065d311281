"""A small grid search in one script, as it is often done before a real run: for each (lr,
weight decay) in a grid, reseed, build a model and an optimizer, train on the training split and
score on the validation split; keep the scores in a list of dicts; then train the best setting
again on training and validation together and keep that model. The splits come from
`random_split` with a generator of their own.
usage: hparam_sweep.py OUT [--epochs N]"""
import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset, random_split

from common import finish, progress

step = 0


def build():
    return nn.Sequential(nn.Linear(10, 32), nn.SiLU(), nn.Linear(32, 1))


def train(model, dataset, lr, weight_decay, epochs):
    global step
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    return optimizer


@torch.no_grad()
def score(model, dataset):
    x, y = dataset[:]
    return F.mse_loss(model(x), y).item()


class Indexed(TensorDataset):
    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(t[index] for t in self.tensors)
        return super().__getitem__(index)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(160, 10)
    y = torch.tanh(x[:, :4].sum(dim=1, keepdim=True)) + 0.05 * torch.randn(160, 1)
    full = Indexed(x, y)
    train_set, val_set = random_split(full, [128, 32], generator=torch.Generator().manual_seed(42))
    val_x, val_y = full[val_set.indices]
    val = Indexed(val_x, val_y)
    results = []
    for lr, weight_decay in itertools.product([3e-3, 1e-2], [0.0, 0.1]):
        torch.manual_seed(1)
        model = build()
        train(model, train_set, lr, weight_decay, args.epochs)
        results.append({"lr": lr, "weight_decay": weight_decay, "val": score(model, val)})
    best = min(results, key=lambda r: r["val"])
    torch.manual_seed(2)
    final = build()
    optimizer = train(final, ConcatDataset([train_set, val]), best["lr"], best["weight_decay"], args.epochs)
    finish(model=final.state_dict(), optimizer=optimizer.state_dict(), results=results)


if __name__ == "__main__":
    main()
