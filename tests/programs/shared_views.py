"""Large tensors written first thing after every boundary (while the writer still reads them),
numpy arrays that alias a tensor (one of them strided), a tensor over a numpy array, a strided
numpy array, and a model with Adam (its first weight 4 MiB: room for a huge page). Each
step's state is saved for the test to compare.
usage: shared_views.py OUT STEPS"""
import json
import os
import sys

import numpy as np
import torch
from common import OUT, progress

torch.manual_seed(3)
big = torch.randn(3 << 20)  # 12 MiB, changed first thing in every step
alias = big[1000:1300].numpy()  # a small numpy view inside big's pages
alias_strided = big[2000:400_000].numpy()[::7]  # a strided one, across many of big's pages
wide = np.random.default_rng(3).standard_normal(1 << 19)  # 4 MiB numpy, changed every step
wide_t = torch.from_numpy(wide)  # a tensor whose storage is numpy's memory
strided = np.arange(200_000, dtype=np.int64)[::3]
model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
os.makedirs(os.path.join(OUT, "states"), exist_ok=True)
for step in range(1, int(sys.argv[2]) + 1):
    big.mul_(0.5).add_(step)
    wide *= 1.001
    strided += 1
    loss = model(torch.randn(16, 256)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    state = {"big": big.clone(), "alias": alias.copy(), "alias_strided": alias_strided.copy(), "wide": wide.copy(),
             "wide_t": wide_t.clone(), "strided": strided.copy(),
             "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, os.path.join(OUT, "states", f"{step}.pt"))
    if step == 1:  # where Adam's large tensors live, for the test to look at their pages
        first = model[0].weight
        large = [first, optimizer.state[first]["exp_avg"], optimizer.state[first]["exp_avg_sq"]]
        with open(os.path.join(OUT, "adam_storages.json"), "w") as f:
            json.dump([[t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()] for t in large], f)
    progress(step)
