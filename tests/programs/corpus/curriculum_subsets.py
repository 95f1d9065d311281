"""Curriculum learning as papers' scripts write it: samples ranked once by a difficulty score,
and each epoch a DataLoader made anew over a Subset of the easiest fraction, which grows with the
epoch (shuffled by the global generator); the model's dropout rate raised at the halfway epoch by
writing to the module's attribute; a per-epoch summary appended to a list of dicts.
usage: curriculum_subsets.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(23)
    x = torch.randn(120, 6)
    y = (x[:, :2].sum(1) > 0).long()
    dataset = TensorDataset(x, y)
    order = torch.argsort(x[:, :2].sum(1).abs(), descending=True).tolist()  # easiest first
    dropout = nn.Dropout(0.0)
    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), dropout, nn.Linear(24, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    summaries, step = [], 0
    for epoch in range(args.epochs):
        fraction = min(1.0, 0.4 + 0.2 * epoch)
        loader = DataLoader(Subset(dataset, order[:int(fraction * len(order))]), batch_size=12, shuffle=True)
        if epoch == args.epochs // 2:
            dropout.p = 0.2
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        summaries.append({"epoch": epoch, "fraction": fraction, "loss": total / len(loader)})
    finish(model=model.state_dict(), summaries=summaries)


if __name__ == "__main__":
    main()
