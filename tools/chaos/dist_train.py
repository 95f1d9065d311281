"""The chaos tool's two-rank workload (forged-c10d): data parallel by hand over gloo, each rank
writing its progress to OUT/rank<R>. usage: dist_train.py OUT STEPS"""

import os
import sys
import time

import torch
import torch.distributed as dist

out, steps = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
w = torch.randn(64, 8)
g = torch.Generator().manual_seed(1000 + rank)
for step in range(steps):
    grad = torch.randn(64, 8, generator=g)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    with open(os.path.join(out, f"rank{rank}.tmp"), "w") as f:
        f.write(str(step + 1))
    os.replace(os.path.join(out, f"rank{rank}.tmp"), os.path.join(out, f"rank{rank}"))
    time.sleep(0.05)
dist.destroy_process_group()
