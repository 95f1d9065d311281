"""From epoch 2 on, the script traces its model with torch.jit.trace for a faster evaluation pass,
keeps the traced module, and evaluates with it after every epoch (its outputs into a CSV).
usage: jit_trace_late.py OUT [--epochs N]"""
import argparse
import csv
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
    torch.manual_seed(12)
    x = torch.randn(120, 7)
    y = (x[:, 1] - x[:, 3] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    val = torch.randn(40, 7)
    model = nn.Sequential(nn.Linear(7, 14), nn.ReLU(), nn.Linear(14, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    traced = None
    step = 0
    with open(os.path.join(args.out, "eval.csv"), "w", newline="") as f:
        out = csv.writer(f)
        for epoch in range(args.epochs):
            if epoch == 2:
                traced = torch.jit.trace(model, val[:2])
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                progress(step)
            with torch.inference_mode():
                scores = (traced if traced is not None else model)(val)
            out.writerow([epoch, f"{scores.sum().item():.6f}"])
            f.flush()
    finish(model=model.state_dict())


if __name__ == "__main__":
    main()
