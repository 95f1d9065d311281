"""A curriculum that switches data by how well the model does: each epoch trains on the easy
loader until validation accuracy passes a threshold, then on the hard one, and reports the
epoch's mean loss over the chosen loader's dataset. AdamW, a cosine schedule over all steps.
usage: curriculum_switch.py OUT [--epochs N] [--by-history]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def make_data(n: int, noise: float, generator: torch.Generator):
    x = torch.randn(n, 10, generator=generator)
    y = ((x[:, 0] + 0.5 * x[:, 1] + noise * torch.randn(n, generator=generator)) > 0).long()
    return TensorDataset(x, y)


def accuracy(model, loader) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(dim=1) == y).sum().item() for x, y in loader)
    model.train()
    return correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.72)
    parser.add_argument("--by-history", action="store_true", help="decide from the list of accuracies, not the last one")
    args = parser.parse_args()

    torch.manual_seed(3)
    g = torch.Generator().manual_seed(3)
    easy_loader = DataLoader(make_data(96, 0.1, g), batch_size=16, shuffle=True)
    hard_loader = DataLoader(make_data(160, 1.0, g), batch_size=16, shuffle=True)
    val_loader = DataLoader(make_data(128, 0.5, g), batch_size=64)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(hard_loader))
    val_acc, step, history, accs = 0.0, 0, [], [0.0]
    for epoch in range(args.epochs):
        if args.by_history:
            loader = easy_loader if max(accs) < args.threshold else hard_loader
        else:
            loader = easy_loader if val_acc < args.threshold else hard_loader
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(xb)
            step += 1
            progress(step)
        val_acc = accuracy(model, val_loader)
        accs.append(val_acc)
        history.append((epoch, len(loader.dataset), total / len(loader.dataset), val_acc))
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history)


if __name__ == "__main__":
    main()
