"""A log file added at a phase change, as scripts that start fine-tuning log it apart: from the
third epoch a `logging.FileHandler` on the script's logger writes each step's loss to
finetune.log, read back at the end. An MLP, SGD, a shuffled DataLoader.
usage: late_logger.py OUT [--epochs N] [--from-epoch E]"""
import argparse
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

log = logging.getLogger("train")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--from-epoch", type=int, default=2)
    args = parser.parse_args()

    log.setLevel(logging.INFO)
    torch.manual_seed(31)
    x = torch.randn(160, 8)
    y = (x[:, :3].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = os.path.join(args.out, "finetune.log")

    step = 0
    for epoch in range(args.epochs):
        if epoch == args.from_epoch:
            handler = logging.FileHandler(path)
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            log.info("epoch %d step %d loss %.6f", epoch, step, loss.item())
            progress(step)
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
