"""A script written for DDP, run as one plain process (`python train.py`, no torchrun), as people
debug theirs: it makes a gloo process group of world size 1 itself (a TCP rendezvous on a free
port), wraps the model in DistributedDataParallel, shards the data with a DistributedSampler
(`set_epoch` each epoch) and all-reduces its metrics. OneCycleLR, gradient accumulation of 2.
With --powersgd setup|late, DDP compresses its gradients with the PowerSGD communication hook
(rank 1, error feedback), registered before the loop or when the second epoch starts.
usage: ddp_one_process.py OUT [--epochs N] [--powersgd setup|late]"""
import argparse
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from common import finish, progress

ACCUMULATE = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--powersgd", choices=["setup", "late"])
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    torch.manual_seed(101)
    x = torch.randn(128, 12)
    y = (x @ torch.randn(12, 1)).squeeze(1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=args.epochs * len(loader) // ACCUMULATE + 1)
    step, epoch_losses = 0, []

    def compress():
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=3)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    if args.powersgd == "setup":
        compress()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if args.powersgd == "late" and epoch == 1:
            compress()
        total = torch.zeros(2)
        for i, (xb, yb) in enumerate(loader):
            loss = F.mse_loss(model(xb).squeeze(1), yb) / ACCUMULATE
            loss.backward()
            if (i + 1) % ACCUMULATE == 0:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
            total += torch.tensor([loss.item() * ACCUMULATE * len(yb), len(yb)])
            step += 1
            progress(step)
        dist.all_reduce(total)
        epoch_losses.append((total[0] / total[1]).item())

    finish(model=model.module.state_dict(), optimizer=optimizer.state_dict(), losses=epoch_losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
