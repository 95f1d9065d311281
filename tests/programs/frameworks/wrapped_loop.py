"""A program whose own step loop is called through a library's wrapper that gpusnap does not
instrument (../trainerlib.py's retrying): no boundary of the loop can be a safe point.
usage: wrapped_loop.py OUT"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import trainerlib
from common import finish, progress


def train(model, optimizer, batches):
    for step, (x, y) in enumerate(batches * 50):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        progress(step + 1)


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(10)]
trainerlib.retrying(train, model, torch.optim.SGD(model.parameters(), lr=0.1), batches)
finish(model=model.state_dict())
