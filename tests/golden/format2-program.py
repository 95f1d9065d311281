"""The program behind tests/golden/format2: a snapshot written by gpusnap before capture/ was cut
into folders (commit 5875bb4's format, 2026-11-28), kept to prove that later versions still
restore what it holds: tensors sharing a storage, numpy arrays, random.Random and numpy
generators, an object of a local class, a generator. expected.pt holds the
same values, saved by torch at the same point.
usage: gpusnap run --dir format2 program.py"""
import random

import numpy as np
import torch

import gpusnap

torch.manual_seed(5)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
base = torch.arange(64, dtype=torch.float32)
view = base[8:40].view(4, 8)  # shares base's storage
table = np.linspace(0.0, 1.0, 50).reshape(5, 10)
py_rng = random.Random(11)
np_rng = np.random.default_rng(12)


def make_local():
    class Local:
        def __init__(self):
            self.total = 0.0

    return Local()


def numbers():
    n = 0
    while True:
        n += 1
        yield n


local = make_local()
gen = numbers()
for step in range(6):
    loss = model(torch.randn(4, 16)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    base.mul_(1.01)
    table += py_rng.random()
    local.total += float(np_rng.standard_normal())
    next(gen)
    if step == 3:
        gpusnap.snapshot()  # taken at the next boundary: the state as it is now
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "base": base.clone(),
                    "table": table.copy(), "py_rng": py_rng.getstate(), "np_rng": np_rng.bit_generator.state,
                    "total": local.total}, "expected.pt")
