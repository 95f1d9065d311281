"""DDP over gloo: a shuffled DistributedSampler, AdamW, a step LR scheduler, dropout (the CPU
RNG differs per rank). usage: ddp.py OUT EPOCHS"""
import sys

import torch
import torch.distributed as dist
from common import RANK, finish, progress
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
epochs = int(sys.argv[2])
torch.manual_seed(0)
X, Y = torch.randn(320, 12), torch.randn(320, 1)
dataset = torch.utils.data.TensorDataset(X, Y)
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
model = DDP(torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)))
torch.manual_seed(100 + RANK)  # dropout masks differ per rank
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.8)
losses = []
step = 0
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        step += 1
        progress(step)
finish(model=model.module.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
       losses=losses, rng=torch.get_rng_state())
dist.destroy_process_group()
