"""Epochs over a DataLoader of an iterable dataset whose __iter__ raises when BREAK_ITER is set
(in the restarted process: during fast-forward). usage: ff_broken_iter.py OUT EPOCHS"""
import os
import sys

import torch
from common import finish, progress


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        if os.environ.get("BREAK_ITER"):
            raise RuntimeError("the data server is gone")
        g = torch.Generator().manual_seed(7)
        for _ in range(16):
            yield torch.randn(12, generator=g)


torch.manual_seed(0)
model = torch.nn.Linear(12, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
step = 0
for epoch in range(int(sys.argv[2])):
    for x in torch.utils.data.DataLoader(Stream(), batch_size=4):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        progress(step)
finish(model=model.state_dict())
