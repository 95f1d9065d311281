"""torch.compile switched on once warm-up is over, as scripts that debug eagerly first do: the model
is trained eagerly for two epochs, then `model = torch.compile(model)` (or the train step, a
function, compiled: --step), Adam over a shuffled DataLoader.
usage: compile_late.py OUT [--epochs N] [--backend B] [--step]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--step", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(83)
    x = torch.randn(128, 8)
    y = torch.sin(x[:, :1]) + x[:, 1:2] ** 2
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def train_step(xb, yb):
        loss = F.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    step = 0
    losses = []
    for epoch in range(args.epochs):
        if epoch == 2:
            if args.step:
                train_step = torch.compile(train_step, backend=args.backend)
            else:
                model = torch.compile(model, backend=args.backend)
        for xb, yb in loader:
            losses.append(round(train_step(xb, yb).item(), 5))
            step += 1
            progress(step)
    finish(model=model.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
