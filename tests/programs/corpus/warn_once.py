"""An older script run on a newer torch, its warnings routed into the run's log
(logging.captureWarnings), as scripts that keep one log do: the schedule is stepped with its epoch
(`scheduler.step(epoch)`, deprecated: torch warns from its own module) and the gradients clipped
with the deprecated `clip_grad_norm` (torch warns from the script's line). Python shows each
once per place, so the log holds each warning once.
usage: warn_once.py OUT [--epochs N]"""
import argparse
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    path = os.path.join(args.out, "train.log")
    logging.basicConfig(filename=path, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.captureWarnings(True)
    log = logging.getLogger("train")
    torch.manual_seed(5)
    x = torch.randn(120, 6)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm(model.parameters(), 1.0)
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        scheduler.step(epoch + 1)
        log.info("epoch %d loss %.5f lr %.4f", epoch, total / len(loader), optimizer.param_groups[0]["lr"])
    logging.shutdown()
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
