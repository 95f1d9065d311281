"""Data parallel by hand: each rank draws its own batches, all-reduces the gradients itself and
steps by manual SGD (no torch.optim, no DDP). usage: allreduce.py OUT STEPS"""
import sys

import torch
import torch.distributed as dist
from common import RANK, finish, progress


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    steps = int(sys.argv[2])
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
        progress(step + 1)
    finish(w=w.detach(), b=b.detach(), history=history, generator=g.get_state())
    dist.destroy_process_group()


main()
