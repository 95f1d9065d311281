"""Each run gets a fresh directory, as YOLO-style scripts name them: runs/exp, runs/exp2, runs/exp3...,
the first name not taken. The run's metrics CSV is opened there in setup; each epoch saves its
weights there, and the best is copied to best.pt; at the end a summary is written next to them.
usage: increment_dir.py OUT [--epochs N]"""
import argparse
import csv
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def increment_path(base):
    if not os.path.exists(base):
        return base
    n = 2
    while os.path.exists(f"{base}{n}"):
        n += 1
    return f"{base}{n}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    save_dir = increment_path(os.path.join(args.out, "runs", "exp"))
    os.makedirs(save_dir)
    torch.manual_seed(11)
    x = torch.randn(128, 4)
    y = x.sum(1, keepdim=True) ** 2
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    results = open(os.path.join(save_dir, "results.csv"), "w", newline="")
    writer = csv.writer(results)
    writer.writerow(["epoch", "loss"])
    best, step = float("inf"), 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        writer.writerow([epoch, f"{total / len(loader):.6f}"])
        results.flush()
        last = os.path.join(save_dir, "last.pt")
        torch.save(model.state_dict(), last)
        if total < best:
            best = total
            shutil.copy(last, os.path.join(save_dir, "best.pt"))
    results.close()
    with open(os.path.join(save_dir, "summary.txt"), "w") as f:
        f.write(f"best {best:.6f} in {os.path.basename(save_dir)}\n")
    runs = sorted(os.listdir(os.path.join(args.out, "runs")))
    with open(os.path.join(save_dir, "results.csv")) as f:
        rows = f.read().splitlines()
    finish(model=model.state_dict(), runs=runs, save_dir=os.path.relpath(save_dir, args.out), rows=rows,
           best=torch.load(os.path.join(save_dir, "best.pt")))


if __name__ == "__main__":
    main()
