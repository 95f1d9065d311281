"""(c) `while step < max_steps` with a manual counter and gradient accumulation (a snapshot may
fall between micro-batches). usage: style_c.py OUT MAX_STEPS"""
import sys

import torch
from common import finish, progress

torch.manual_seed(2)
max_steps = int(sys.argv[2])
accumulate = 3
data_rng = torch.Generator().manual_seed(7)
model = torch.nn.Linear(10, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
micro = 0
losses = []
while step < max_steps:
    x = torch.randn(4, 10, generator=data_rng)
    y = torch.randn(4, 2, generator=data_rng)
    loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
    loss.backward()
    micro += 1
    losses.append(loss.item())
    if micro % accumulate == 0:
        optimizer.step()
        optimizer.zero_grad()
        step += 1
    progress(micro)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, micro=micro)
