"""(e) bf16 autocast on CPU and a numpy-Generator-driven data generator (fast-forward by
consumption). usage: style_e.py OUT STEPS"""
import sys

import numpy as np
import torch
from common import finish, progress

torch.manual_seed(4)
rng = np.random.default_rng(11)


def batches(count):
    for _ in range(count):
        x = rng.standard_normal((8, 16)).astype(np.float32)
        yield torch.from_numpy(x), torch.from_numpy(x[:, :1] * 2.0)


model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
losses = []
for step, (x, y) in enumerate(batches(int(sys.argv[2])), start=1):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    progress(step)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, rng=rng.bit_generator.state)
