"""CUDA tensors updated in a loop, on the GPU when there is one, with exact arithmetic (so a run
restored onto the CPU ends with the same bytes): a weight updated in place, a view of it, and
tensors made during training (the replay does not hold them: restore places them).
usage: on_cuda.py OUT STEPS"""
import sys

import torch
from common import finish, progress

device = "cuda" if torch.cuda.is_available() else "cpu"
w = torch.zeros(1 << 20, device=device)  # 4 MiB: one store chunk
head = w[:16]  # a view: stays a view of w
kept = []
for step in range(int(sys.argv[2])):
    w += 1
    head.mul_(2).remainder_(1 << 20)
    if step % 50 == 0:
        kept.append(w[:8].clone())
    progress(step + 1)
finish(w=w.cpu(), head=head.cpu(), kept=[t.cpu() for t in kept], shares=head.data_ptr() == w.data_ptr())
