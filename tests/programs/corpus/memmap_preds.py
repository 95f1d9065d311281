"""Each epoch's predictions on a held-out set written into one array on disk, a NumPy memmap
(np.lib.format.open_memmap, mode "w+") made at the first evaluation (--setup: before training),
a row per epoch, flushed; the file is loaded back at the end. An MLP, Adam, a shuffled DataLoader.
usage: memmap_preds.py OUT [--epochs N] [--setup]"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--setup", action="store_true")
    args = parser.parse_args()

    path = os.path.join(args.out, "preds.npy")
    torch.manual_seed(47)
    x = torch.randn(192, 10)
    y = (x[:, 5:9].sum(1) > 0).long()
    held_out = torch.randn(32, 10)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    shape = (args.epochs, len(held_out))
    preds = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape) if args.setup else None

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        if preds is None:
            preds = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        with torch.no_grad():
            preds[epoch] = model(held_out).softmax(1)[:, 1].numpy()
        preds.flush()

    del preds
    finish(model=model.state_dict(), preds=torch.from_numpy(np.load(path)))


if __name__ == "__main__":
    main()
