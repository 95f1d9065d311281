"""Training beside a large, changing buffer, so that writing a snapshot takes a while.
usage: big_state.py OUT STEPS MEGABYTES"""
import sys

import torch
from common import finish, progress

torch.manual_seed(6)
big = torch.randn(int(sys.argv[3]) * (1 << 20) // 4)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[2])):
    big += 1.0
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    progress(step + 1)
finish(model=model.state_dict(), checksum=float(big[:1000].sum()))
