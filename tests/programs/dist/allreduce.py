"""Data parallel by hand: each rank draws its own batches, all-reduces the gradients itself and
steps by manual SGD (no torch.optim, no DDP). usage: allreduce.py OUT STEPS [log]: with "log", each
rank appends a line to OUT/rank<R>/train.log every step (a file of its own, as a rank's logger keeps)."""
import os
import sys

import torch
import torch.distributed as dist
from common import OUT, RANK, finish, progress


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    steps = int(sys.argv[2])
    log = sys.argv[3:4] == ["log"]
    torch.manual_seed(0)
    w = torch.randn(16, 4, requires_grad=True)
    b = torch.zeros(4, requires_grad=True)
    g = torch.Generator().manual_seed(1000 + RANK)
    lr = 0.05
    history = []
    for step in range(steps):
        x = torch.randn(32, 16, generator=g)
        y = x[:, :4].sin()
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                dist.all_reduce(p.grad)
                p -= lr * p.grad / world
                p.grad = None
        total = loss.detach().clone()
        dist.all_reduce(total)
        history.append(total.item())
        if log:
            with open(os.path.join(OUT, "train.log"), "a") as f:
                f.write(f"step {step} loss {history[-1]:.6f}\n")
        progress(step + 1)
    finish(w=w.detach(), b=b.detach(), history=history, generator=g.get_state())
    dist.destroy_process_group()


main()
