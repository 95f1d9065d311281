"""A script that handles preemption itself, as cluster guides teach: a SIGTERM handler sets a
flag, and the loop, seeing it, saves a checkpoint and exits 0 (--exit-in-handler: the handler
exits at once; --chain: it also calls the handler it found installed, as Lightning's does, and
notes each call in OUT/handled.txt); at start it resumes from that checkpoint when one exists.
--signal USR1 handles SIGUSR1 instead, the warning SLURM's --signal=USR1@90 sends before the
time limit. SGD with momentum over a shuffled DataLoader, a StepLR.
usage: graceful_exit.py OUT [--epochs N] [--exit-in-handler | --chain] [--signal TERM|USR1]"""
import argparse
import os
import signal
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

stop_requested = False


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


def exit_now(signum, frame):
    sys.exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--exit-in-handler", action="store_true")
    parser.add_argument("--chain", action="store_true")
    parser.add_argument("--signal", choices=["TERM", "USR1"], default="TERM")
    args = parser.parse_args()
    signum = getattr(signal, "SIG" + args.signal)
    if args.chain:
        previous = signal.getsignal(signum)

        def chained(signum, frame):
            with open(os.path.join(args.out, "handled.txt"), "a") as f:
                f.write(signal.Signals(signum).name + "\n")
            request_stop(signum, frame)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signum, chained)
    else:
        signal.signal(signum, exit_now if args.exit_in_handler else request_stop)

    torch.manual_seed(41)
    x = torch.randn(320, 10)
    y = (x[:, :2].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    ckpt = os.path.join(args.out, "preempted.pt")
    start_epoch, step, losses = 0, 0, []
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start_epoch, step, losses = state["epoch"], state["step"], state["losses"]
    for epoch in range(start_epoch, args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        scheduler.step()
        if stop_requested:  # at an epoch's end: the checkpoint holds whole epochs only
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),
                        "epoch": epoch + 1, "step": step, "losses": losses}, ckpt)
            sys.exit(0)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
