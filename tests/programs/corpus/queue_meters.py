"""Bookkeeping the thread-safe way, though the loop is one thread: a hard-example buffer in a
queue.Queue(maxsize) (the hardest batch of each step put in, the oldest taken out and trained on
again when full), an AverageMeter guarded by a threading.Lock, a step counter from
itertools.count, learning-rate phases from iter([...]) advanced with next() at each epoch.
usage: queue_meters.py OUT [--epochs N]"""
import argparse
import itertools
import queue
import threading

import torch
from torch import nn

from common import finish, progress


class AverageMeter:
    def __init__(self):
        self._lock = threading.Lock()
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        with self._lock:
            self.sum += value * n
            self.count += n

    @property
    def avg(self):
        with self._lock:
            return self.sum / max(self.count, 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hard = queue.Queue(maxsize=5)
    meter = AverageMeter()
    steps = itertools.count(1)
    phases = iter([0.1, 0.05, 0.02, 0.01])
    history = []
    for epoch in range(args.epochs):
        for group in optimizer.param_groups:
            group["lr"] = next(phases)
        for xb, yb in loader:
            if hard.full():
                hx, hy = hard.get()
                xb, yb = torch.cat([xb, hx]), torch.cat([yb, hy])
            losses = nn.functional.cross_entropy(model(xb), yb, reduction="none")
            loss = losses.mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            worst = losses.detach().topk(2).indices
            hard.put((xb[worst], yb[worst]))
            meter.update(loss.item(), len(xb))
            step = next(steps)
            history.append((step, loss.item(), meter.avg, hard.qsize()))
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history)


if __name__ == "__main__":
    main()
