"""FSDP2 (fully_shard) over gloo: each rank holds a shard of every parameter and of the AdamW
state; each rank draws its own batches. usage: fsdp.py OUT STEPS"""
import sys

import torch
import torch.distributed as dist
from common import RANK, finish, progress
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
steps = int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(100 + RANK)
losses = []
for step in range(steps):
    x = torch.randn(8, 16, generator=g)
    loss = ((model(x) - x[:, :4].cos()) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    progress(step + 1)
finish(model={k: v.to_local().clone() for k, v in model.state_dict().items()},
       optimizer=[{k: v.to_local().clone() if hasattr(v, "to_local") else v for k, v in s.items()} for s in optimizer.state.values()],
       losses=losses)
dist.destroy_process_group()
