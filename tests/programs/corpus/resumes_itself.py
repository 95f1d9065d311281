"""A script that checkpoints and resumes itself, as cluster jobs written before gpusnap do: at
start it loads `OUT/checkpoint.pt` if one is there (model, optimizer, scheduler, step and the
RNG state) and goes on from that step; every few steps it saves one (to a temporary name, then
os.replace); a SIGUSR1 handler, as Slurm's `--signal` sends, sets a flag on which the loop saves
and stops early.
usage: resumes_itself.py OUT [--steps N] [--every N]"""
import argparse
import os
import signal

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

stop_requested = False


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


def save(path, step, model, optimizer, scheduler):
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, request_stop)

    torch.manual_seed(51)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    path = os.path.join(args.out, "checkpoint.pt")
    start = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        torch.set_rng_state(checkpoint["rng"])
        start = checkpoint["step"]
        print(f"resumed from step {start}", flush=True)

    for step in range(start, args.steps):
        x = torch.randn(16, 10)
        y = x[:, :2].sum(1, keepdim=True)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if (step + 1) % args.every == 0 or stop_requested:
            save(path, step + 1, model, optimizer, scheduler)
        if stop_requested:
            return
        progress(step + 1)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict())


if __name__ == "__main__":
    main()
