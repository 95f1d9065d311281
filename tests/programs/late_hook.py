"""Gradient hooks made mid-run: at step 3 the loop makes a Hooks object holding a lambda (a closure
over a scale), and every 10th step applies its hooks to the gradients. A restart gives the
object back whole, but not the lambda it holds. usage: late_hook.py OUT STEPS"""
import sys

import torch
from common import finish, progress


class Hooks:
    def __init__(self):
        self.fns = []


torch.manual_seed(5)
hooks = None
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(int(sys.argv[2])):
    if step == 3:
        scale = 0.5
        hooks = Hooks()
        hooks.fns.append(lambda grad: grad * scale)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    if hooks is not None and step % 10 == 9:
        for p in model.parameters():
            for fn in hooks.fns:
                p.grad = fn(p.grad)
    optimizer.step()
    progress(step + 1)
finish(model=model.state_dict())
