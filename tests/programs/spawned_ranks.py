"""Ranks spawned by the program itself, as the PyTorch examples' multi-process scripts do
(`torch.multiprocessing.spawn(main_worker, nprocs=...)`): each trains its own copy here (no
process group, so that no port is needed). usage: spawned_ranks.py OUT STEPS"""
import sys

import torch
import torch.multiprocessing as mp
from common import finish, progress


def main_worker(rank, steps):
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            progress(step + 1)
    if rank == 0:
        finish(model=model.state_dict())


if __name__ == "__main__":
    mp.spawn(main_worker, args=(int(sys.argv[2]),), nprocs=2)
