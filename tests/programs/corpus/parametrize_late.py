"""A discriminator-style net that gets spectral normalization (torch.nn.utils.parametrizations)
on two layers once warm-up is over, and a symmetric parametrization of the script's own on
another: the power iteration's u and v move in every training forward. With --setup, the last
layer has weight normalization from the start, and spectral normalization stacks on it.
usage: parametrize_late.py OUT [--epochs N] [--kind spectral|symmetric|both] [--setup]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.parametrize as P
from torch.nn.utils.parametrizations import spectral_norm
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(-1, -2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--kind", default="both")
    parser.add_argument("--setup", action="store_true", help="weight_norm on the last layer before the loop")
    args = parser.parse_args()
    torch.manual_seed(9)
    x = torch.randn(128, 10)
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 10), nn.LeakyReLU(0.2), nn.Linear(10, 16), nn.LeakyReLU(0.2), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.5, 0.999))
    if args.setup:
        torch.nn.utils.parametrizations.weight_norm(model[4])
    step = 0
    for epoch in range(args.epochs):
        if epoch == 2:
            if args.kind in ("spectral", "both"):
                spectral_norm(model[2])
                spectral_norm(model[4])
            if args.kind in ("symmetric", "both"):
                P.register_parametrization(model[0], "weight", Symmetric())
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict())


if __name__ == "__main__":
    main()
