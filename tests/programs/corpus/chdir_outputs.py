"""A script that works inside an output directory of its own, as Hydra's `hydra.job.chdir`
makes one: a directory named by the start time, made in setup, and `os.chdir` into it
(`setup`), or OUT entered in setup and a directory in it for the fine-tuning phase entered at
--phase-epoch (`phase`). Each
epoch appends its loss to metrics.csv there, by a relative path, and reads the file back to
halve the rate when an epoch did not beat the best so far.
usage: chdir_outputs.py OUT MODE [--epochs N] [--phase-epoch N]"""
import argparse
import datetime
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def best_so_far():
    with open("metrics.csv") as f:
        return min(float(line.split(",")[1]) for line in f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["setup", "phase"])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--phase-epoch", type=int, default=2)
    args = parser.parse_args()

    if args.mode == "setup":
        run_dir = os.path.join("outputs", datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f"))
        os.makedirs(run_dir)
        os.chdir(run_dir)
    else:
        os.chdir(args.out)
    torch.manual_seed(18)
    x = torch.randn(256, 16)
    y = x[:, :3].sum(1, keepdim=True).sin()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    step, halvings = 0, 0
    for epoch in range(args.epochs):
        if args.mode == "phase" and epoch == args.phase_epoch:
            os.makedirs("finetune", exist_ok=True)
            os.chdir("finetune")
        total = 0.0
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        mean = total / len(loader)
        best = best_so_far() if os.path.exists("metrics.csv") else float("inf")
        with open("metrics.csv", "a") as f:
            f.write(f"{epoch},{mean:.6f}\n")
        if mean > best * 0.98:
            halvings += 1
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
    with open("metrics.csv") as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), metrics=lines, halvings=halvings)


if __name__ == "__main__":
    main()
