"""Post-local SGD as torch's model-averaging docs lay it out: DDP with the post_localSGD_hook
(all-reduced gradients for the first 6 iterations, then each rank's subgroup of one, local SGD)
and a PeriodicModelAverager that averages the parameters every 4 steps after its warm-up, which
leaves them views of one flat tensor. Each rank trains on its own data.
usage: local_sgd.py OUT EPOCHS"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as averagers
import torch.nn as nn
import torch.nn.functional as F
from common import RANK, finish, progress
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    epochs = int(sys.argv[2])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2)))
    subgroup, _ = dist.new_subgroups(group_size=1)
    state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=6)
    model.register_comm_hook(state, post_localSGD_hook)
    averager = averagers.PeriodicModelAverager(period=4, warmup_steps=6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(40 + RANK)
    x, y = torch.randn(48, 12, generator=g), torch.randint(0, 2, (48,), generator=g)
    step, losses = 0, []
    for epoch in range(epochs):
        for i in range(0, 48, 6):
            loss = F.cross_entropy(model(x[i:i + 6]), y[i:i + 6])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            averager.average_parameters(model.parameters())
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.module.state_dict(), optimizer=optimizer.state_dict(), losses=losses,
           iterations=(state.iter, averager.step))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
