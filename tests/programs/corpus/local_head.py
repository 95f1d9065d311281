"""Model classes defined inside main(); at epoch 2 the script grows a second head of its local
class (with a __slots__ config object of another local class) and adds its parameters to the
optimizer.
usage: local_head.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    class HeadConfig:
        __slots__ = ("width", "scale")

        def __init__(self, width, scale):
            self.width, self.scale = width, scale

    class Head(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.fc = nn.Linear(cfg.width, 2)

        def forward(self, h):
            return self.fc(h) * self.cfg.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(5, 10), nn.Tanh())
            self.heads = nn.ModuleList([Head(HeadConfig(10, 1.0))])

        def forward(self, x):
            h = self.body(x)
            return sum(head(h) for head in self.heads)

    torch.manual_seed(6)
    x = torch.randn(96, 5)
    y = (x[:, 1] * x[:, 2] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    for epoch in range(args.epochs):
        if epoch == 2:
            head = Head(HeadConfig(10, 0.5))
            model.heads.append(head)
            optimizer.add_param_group({"params": head.parameters(), "lr": 1e-2})
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scales=[h.cfg.scale for h in model.heads])


if __name__ == "__main__":
    main()
