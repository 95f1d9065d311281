"""DDP compressing its gradients with the PowerSGD communication hook (rank 1, error feedback),
registered before the loop as the DDP communication-hook docs show, or with --late when the
second epoch starts. Each rank trains on its own slice of the data.
usage: comm_hook.py OUT EPOCHS [--late]"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import RANK, finish, progress
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP


def compress(model, start):
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=start)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    return state


def main():
    epochs, late = int(sys.argv[2]), "--late" in sys.argv
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = None if late else compress(model, start=4)
    g = torch.Generator().manual_seed(10 + RANK)
    x, y = torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
    step, losses = 0, []
    for epoch in range(epochs):
        if late and epoch == 1:
            state = compress(model, start=2)
        for i in range(0, 64, 8):
            loss = F.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.module.state_dict(), optimizer=optimizer.state_dict(), losses=losses,
           compressed_iterations=state.iter, errors=dict(state.error_dict))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
