"""A dataset over a binary records file written at start, opened lazily in __getitem__ (as HDF5 and
LMDB datasets do so that DataLoader workers each open their own), with __getstate__ dropping the
handle. Records are read by seek; a shuffled DataLoader; an MLP with AdamW.
usage: lazy_handle.py OUT [--epochs N]"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import finish, progress

DIM = 10


class Records(Dataset):
    def __init__(self, path, n):
        self.path = path
        self.n = n
        self.handle = None
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.handle is None:
            self.handle = open(self.path, "rb")
        self.handle.seek(i * (DIM + 1) * 4)
        row = np.frombuffer(self.handle.read((DIM + 1) * 4), dtype=np.float32)
        self.reads += 1
        return torch.from_numpy(row[:DIM].copy()), torch.tensor(int(row[DIM]))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["handle"] = None
        return state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    data = rng.standard_normal((200, DIM + 1)).astype(np.float32)
    data[:, DIM] = (data[:, 0] + data[:, 1] > 0).astype(np.float32)
    path = os.path.join(args.out, "records.bin")
    data.tofile(path)
    torch.manual_seed(11)
    dataset = Records(path, 200)
    loader = DataLoader(dataset, batch_size=20, shuffle=True)
    model = nn.Sequential(nn.Linear(DIM, 16), nn.GELU(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), reads=dataset.reads)


if __name__ == "__main__":
    main()
