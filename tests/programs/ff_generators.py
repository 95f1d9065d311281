"""Training from a generator. usage: ff_generators.py OUT STYLE EPOCHS
STYLE interleaved: the generator draws its batches from the global torch RNG, and so does the
loop body (fast-forward cannot reproduce that by consuming it); seeded: the generator draws from
a torch.Generator of its own, seeded per epoch (consuming it reproduces it exactly)."""
import sys

import torch
from common import finish, progress

torch.manual_seed(0)
style, epochs = sys.argv[2], int(sys.argv[3])
model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
losses = []
step = 0


def interleaved(n):
    for _ in range(n):
        x = torch.randn(8, 12)
        yield x, x.sum(1, keepdim=True)


def seeded(n, epoch):
    g = torch.Generator().manual_seed(100 + epoch)
    for _ in range(n):
        x = torch.randn(8, 12, generator=g)
        yield x, x.sum(1, keepdim=True)


for epoch in range(epochs):
    source = interleaved(20) if style == "interleaved" else seeded(20, epoch)
    for x, y in source:
        noise = torch.randn_like(x) * 0.01  # the body draws from the global RNG too
        loss = torch.nn.functional.mse_loss(model(x + noise), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        progress(step)
finish(model=model.state_dict(), losses=losses)
