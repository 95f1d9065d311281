"""A script that saves its own checkpoints every few steps and keeps only the newest two,
deleting older ones it finds with glob, and appends a line per step to a metrics CSV it reopens
each time. The final state records the files the run directory holds and their digests.
usage: rotating_checkpoints.py OUT [--steps N]"""
import argparse
import glob
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()

    ckpt_dir = os.path.join(args.out, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    metrics = os.path.join(args.out, "metrics.csv")
    with open(metrics, "w") as f:
        f.write("step,loss\n")
    torch.manual_seed(31)
    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True).tanh()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-2)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, 256, (16,))
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        with open(metrics, "a") as f:
            f.write(f"{step},{loss.item():.6f}\n")
        if step % args.save_every == 0:
            torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(ckpt_dir, f"ckpt_{step:05d}.pt"))
            for old in sorted(glob.glob(os.path.join(ckpt_dir, "ckpt_*.pt")))[:-2]:
                os.remove(old)
        progress(step)
    files = {}
    for path in sorted(glob.glob(os.path.join(args.out, "**", "*.*"), recursive=True)):
        name = os.path.relpath(path, args.out)
        if name.endswith((".csv", ".pt")) and name != "final.pt":
            with open(path, "rb") as f:
                files[name] = hashlib.sha256(f.read()).hexdigest() if name.endswith(".csv") else len(torch.load(path)["model"])
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), files=files)


if __name__ == "__main__":
    main()
