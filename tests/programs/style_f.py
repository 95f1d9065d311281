"""(f) manual SGD without torch.optim; the learning rate lives in a module global.
usage: style_f.py OUT STEPS"""
import sys

import torch
from common import finish, progress

torch.manual_seed(5)
lr = 0.05
w = torch.randn(6, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
true_w = torch.randn(6, 1)
losses = []


def decay():
    global lr
    lr *= 0.95


for step in range(int(sys.argv[2])):
    x = torch.randn(16, 6)
    loss = ((x @ w + b - x @ true_w) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= lr * w.grad
        b -= lr * b.grad
        w.grad.zero_()
        b.grad.zero_()
    if step % 10 == 9:
        decay()
    losses.append(loss.item())
    progress(step + 1)
finish(w=w, b=b, lr=lr, losses=losses)
