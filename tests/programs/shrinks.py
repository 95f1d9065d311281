"""Training whose optimizer state shrinks partway: a large model first, then a small one in its
place (so a snapshot that stages the large state may not fit where one of the small state does).
usage: shrinks.py OUT STEPS SWITCH_AT"""
import gc
import sys

import torch
from common import finish, progress

torch.manual_seed(4)
steps, switch_at = int(sys.argv[2]), int(sys.argv[3])
big = torch.nn.Linear(1024, 1024)  # 4 MiB of weights: 12 MiB with Adam's state
big_optimizer = torch.optim.Adam(big.parameters(), lr=1e-3)


def train(model, optimizer):
    loss = model(torch.randn(8, model.in_features)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


for step in range(steps):
    if step < switch_at:
        train(big, big_optimizer)
    else:
        if step == switch_at:  # a restart past this point builds the small model from the snapshot
            del big, big_optimizer
            gc.collect()  # the large model and its optimizer state are gone
            small = torch.nn.Linear(256, 256)  # 768 KiB with Adam's state
            small_optimizer = torch.optim.Adam(small.parameters(), lr=1e-3)
        train(small, small_optimizer)
    progress(step + 1)
finish(model=small.state_dict(), optimizer=small_optimizer.state_dict())
