"""Checkpoints every 4 steps to ckpt/step_N.pt, a `latest` symlink moved to each new one (made
under a temporary name, then os.replace), the oldest removed beyond the last two. At the end the
model loads `latest`; the directory's listing (names, link targets, sizes) is part of the final
state.
usage: symlink_latest.py OUT [--steps N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=36)
    args = parser.parse_args()
    ckpt = os.path.join(args.out, "ckpt")
    os.makedirs(ckpt, exist_ok=True)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    kept = []
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 4)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 0:
            name = f"step_{step}.pt"
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(ckpt, name))
            tmp = os.path.join(ckpt, "latest.tmp")
            os.symlink(name, tmp)
            os.replace(tmp, os.path.join(ckpt, "latest"))
            kept.append(name)
            if len(kept) > 2:
                os.remove(os.path.join(ckpt, kept.pop(0)))
        progress(step)
    state = torch.load(os.path.join(ckpt, "latest"))
    listing = []
    for name in sorted(os.listdir(ckpt)):
        p = os.path.join(ckpt, name)
        listing.append(f"{name} -> {os.readlink(p)}" if os.path.islink(p) else f"{name} {os.path.getsize(p)}")
    finish(model=model.state_dict(), latest=state["model"], latest_step=state["step"], listing=listing)


if __name__ == "__main__":
    main()
