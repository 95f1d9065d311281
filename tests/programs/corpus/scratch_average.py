"""Checkpoint averaging through a scratch directory, as translation scripts average their last
epochs: each epoch's weights are saved into a `tempfile.TemporaryDirectory` made in setup
(`--mkdtemp`: a `tempfile.mkdtemp()` path), and the end loads every file there and averages
them into the output model; each epoch's mean loss is appended to a log there, which the end
reads back. An MLP, Adam, a shuffled DataLoader.
usage: scratch_average.py OUT [--epochs N] [--mkdtemp]"""
import argparse
import glob
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--mkdtemp", action="store_true")
    args = parser.parse_args()

    if args.mkdtemp:
        scratch_dir = tempfile.mkdtemp(prefix="avg-")
    else:
        scratch = tempfile.TemporaryDirectory(prefix="avg-")
        scratch_dir = scratch.name
    torch.manual_seed(8)
    x = torch.randn(192, 10)
    y = (x[:, :3].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    log_path = os.path.join(scratch_dir, "losses.txt")
    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        torch.save(model.state_dict(), os.path.join(scratch_dir, f"epoch{epoch:03d}.pt"))
        with open(log_path, "a") as log:
            log.write(f"{epoch} {total / len(loader):.6f}\n")

    paths = sorted(glob.glob(os.path.join(scratch_dir, "epoch*.pt")))
    states = [torch.load(p) for p in paths]
    averaged = {k: sum(s[k] for s in states) / len(states) for k in states[0]}
    with open(log_path) as log:
        losses = log.read().splitlines()
    if args.mkdtemp:
        shutil.rmtree(scratch_dir)
    else:
        scratch.cleanup()
    finish(model=model.state_dict(), averaged=averaged, epochs_averaged=len(paths), losses=losses)


if __name__ == "__main__":
    main()
