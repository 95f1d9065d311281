"""Each step's loss logged through a RotatingFileHandler that rolls train.log over every 1.5 kB,
keeping three backups, all read back at the end.
usage: rotating_log.py OUT [--epochs N]"""
import argparse
import logging
import logging.handlers
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

logger = logging.getLogger("trainer")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    path = os.path.join(args.out, "train.log")
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1500, backupCount=3)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    torch.manual_seed(5)
    x = torch.randn(128, 6)
    y = x @ torch.randn(6, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            logger.info("epoch=%d step=%d loss=%.6f", epoch, step, loss.item())
            progress(step)
    logs = {}
    for name in sorted(os.listdir(args.out)):
        if name.startswith("train.log"):
            with open(os.path.join(args.out, name)) as f:
                logs[name] = f.read()
    finish(model=model.state_dict(), logs=logs)


if __name__ == "__main__":
    main()
