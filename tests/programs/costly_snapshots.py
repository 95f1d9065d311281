"""Training whose snapshots cost a known amount: each iteration takes STEP_S, and each of the
SLOW_ITERATIONS iterations after gpusnap forks a writer (a new child process appears) takes
SLOW_S more, as a writer that competed for the trainee's cores would make them. A snapshot
thus costs SLOW_ITERATIONS * SLOW_S plus its stall.
usage: costly_snapshots.py OUT STEPS STEP_S SLOW_S SLOW_ITERATIONS"""
import os
import sys
import time

import torch
from common import finish, progress

steps, step_s, slow_s, slow_iterations = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
CHILDREN = f"/proc/self/task/{os.getpid()}/children"


def children() -> set:
    with open(CHILDREN) as f:
        return set(f.read().split())


torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
seen = children()
slow_left = 0
for step in range(steps):
    now = children()
    if now - seen:
        slow_left = slow_iterations  # a writer was forked at the boundary before this iteration
    seen = now
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(step_s + (slow_s if slow_left > 0 else 0.0))
    slow_left -= 1
    progress(step + 1)
finish(model=model.state_dict())
