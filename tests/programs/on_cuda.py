"""A CUDA tensor updated in a loop (GPU machines only). usage: on_cuda.py OUT STEPS"""
import sys

import torch
from common import finish, progress

w = torch.zeros(1024, device="cuda")
for step in range(int(sys.argv[2])):
    w += 1
    progress(step + 1)
finish(w=w.cpu())
