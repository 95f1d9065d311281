"""A model fit by a trainer that gpusnap knows nothing of (site-packages/minitrainer.py).
usage: unknown_trainer.py OUT"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, ".."), os.path.join(here, "site-packages")]
import torch
from common import finish, progress
from minitrainer import fit

model = torch.nn.Linear(4, 1)
fit(model, torch.optim.SGD(model.parameters(), lr=0.01), steps=400, report=progress)
finish(model=model.state_dict())
