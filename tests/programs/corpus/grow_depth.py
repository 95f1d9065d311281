"""A network that grows as it trains: every two epochs a new residual block, initialised to
nothing (its last layer zeroed), joins a ModuleList and the optimizer as a new parameter group
with its own learning rate. AdamW; the data are drawn once, batches from a shuffled DataLoader.
usage: grow_depth.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)
        nn.init.zeros_(self.outer.weight)
        nn.init.zeros_(self.outer.bias)

    def forward(self, x):
        return x + self.outer(F.gelu(self.inner(x)))


class GrowingNet(nn.Module):
    def __init__(self, d_in: int, width: int):
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([Block(width)])
        self.head = nn.Linear(width, 1)

    def grow(self) -> nn.Module:
        block = Block(self.stem.out_features)
        self.blocks.append(block)
        return block

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(8)
    x = torch.randn(256, 6)
    y = torch.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = GrowingNet(6, 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch and epoch % 2 == 0:
            block = model.grow()
            optimizer.add_param_group({"params": block.parameters(), "lr": 1e-2})
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, depth=len(model.blocks))


if __name__ == "__main__":
    main()
