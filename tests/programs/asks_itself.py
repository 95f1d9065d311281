"""Calls gpusnap.snapshot() itself at step 5. usage: asks_itself.py OUT STEPS"""
import sys

import gpusnap
import torch
from common import finish, progress

weights = torch.arange(4.0)
asked = None
for step in range(int(sys.argv[2])):
    weights += 1
    if step == 5:
        asked = gpusnap.snapshot()
    progress(step + 1)
finish(weights=weights, asked=asked)
