"""Batches made ahead by a background thread, as hand-written input pipelines do (a
"BackgroundGenerator"): a daemon thread iterates a shuffled DataLoader, epoch after epoch, into
a queue.Queue of a few batches, and the training loop takes them from the queue until the thread
puts None.
usage: prefetch_thread.py OUT [--epochs N] [--depth N]"""
import argparse
import queue
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Prefetcher:
    def __init__(self, loader, epochs, depth):
        self.queue = queue.Queue(depth)
        self.thread = threading.Thread(target=self._fill, args=(loader, epochs), daemon=True)
        self.thread.start()

    def _fill(self, loader, epochs):
        for _ in range(epochs):
            for batch in loader:
                self.queue.put(batch)
        self.queue.put(None)

    def __iter__(self):
        while (batch := self.queue.get()) is not None:
            yield batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(41)
    x = torch.randn(320, 12)
    y = (x[:, :3].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    losses = []
    for step, (xb, yb) in enumerate(Prefetcher(loader, args.epochs, args.depth), 1):
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
