"""The program behind tests/golden/format1: a snapshot written by gpusnap before its writer ran in
parallel (commit dd59f29, every chunk ZSTD-1 or raw, 16 KiB chunks), kept to prove that later
versions still restore it; expected.pt holds the same state, saved by torch at the same point.
usage: GPUSNAP_CHUNK_BYTES=16384 gpusnap run --dir format1 program.py"""
import torch

import gpusnap

torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
with torch.no_grad():
    model[2].weight[:, :64] = 0  # chunks of zeros: compressed; the others mostly raw
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(6):
    loss = model(torch.randn(16, 32)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 3:
        gpusnap.snapshot()  # taken at the next boundary: the state as it is now
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "expected.pt")
