"""LBFGS with a closure, and a model whose forward has its own loop: the program asks for a
snapshot from inside the closure of its first step, where the only loop boundaries are inside
forward (called back from torch.optim). usage: closure_step.py OUT STEPS"""
import sys

import gpusnap
import torch
from common import finish, progress


class Unrolled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.cell(x))
        return x


torch.manual_seed(2)
model = Unrolled()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
x, y = torch.randn(16, 4), torch.randn(16, 4)
calls = 0


def closure():
    global calls
    calls += 1
    if calls == 1:
        gpusnap.snapshot()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


losses = []
for step in range(int(sys.argv[2])):
    losses.append(float(optimizer.step(closure)))
    progress(step + 1)
finish(model=model.state_dict(), losses=losses, calls=calls)
