"""Warm up an MLP, then trace it with torch.fx, rewrite its graph (ReLU to GELU) and train the
GraphModule on with a new optimizer: model surgery at a phase change. With --setup, the model is
traced before the loop too (the rewrite then traces the GraphModule again).
usage: fx_late.py OUT [--epochs N] [--setup]"""
import argparse

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 12)
        self.b = nn.Linear(12, 12)
        self.c = nn.Linear(12, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h)) + h
        return self.c(h)


def to_gelu(model):
    gm = torch.fx.symbolic_trace(model)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.relu:
            node.target = F.gelu
    gm.recompile()
    return gm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--setup", action="store_true", help="trace before the loop, rewrite at epoch 2")
    args = parser.parse_args()
    torch.manual_seed(5)
    x = torch.randn(120, 6)
    y = (x[:, 0] * x[:, 2] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.setup:
        model = torch.fx.symbolic_trace(model)
    step = 0
    losses = []
    for epoch in range(args.epochs):
        if epoch == 2:
            model = to_gelu(model)
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            progress(step)
    finish(model=model.state_dict(), code=model.code if hasattr(model, "code") else "", losses=losses,
           optimizer=optimizer.state_dict())


if __name__ == "__main__":
    main()
