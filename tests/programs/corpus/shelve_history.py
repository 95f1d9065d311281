"""A run history in a shelve database opened at start: each step appends its loss to a list under
"losses" (read, extend, write back), each epoch stores its mean under its own key.
usage: shelve_history.py OUT [--epochs N]"""
import argparse
import os
import shelve

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(41)
    x = torch.randn(100, 4)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = shelve.open(os.path.join(args.out, "history"))
    history["losses"] = []
    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history["losses"] = history["losses"] + [round(loss.item(), 6)]
            total += loss.item()
            step += 1
            progress(step)
        history[f"epoch{epoch}"] = round(total / len(loader), 6)
    kept = {key: history[key] for key in sorted(history.keys())}
    history.close()
    finish(model=model.state_dict(), history=kept)


if __name__ == "__main__":
    main()
