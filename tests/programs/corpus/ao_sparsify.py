"""Gradual magnitude pruning with torch.ao.pruning: a WeightNormSparsifier prepared on the two
hidden layers after a dense warm-up epoch (parametrizations with masks), stepped every 5 steps by
a cubic schedule toward 80% sparsity, squashed (masks folded in) for the last epoch.
usage: ao_sparsify.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.pruning import WeightNormSparsifier

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(12)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.randn(96, 16), torch.randint(0, 4, (96,))
    sparsifier, step, levels = None, 0, []
    for epoch in range(args.epochs):
        if epoch == 1:
            sparsifier = WeightNormSparsifier(sparsity_level=0.0, sparse_block_shape=(1, 4), zeros_per_block=4)
            sparsifier.prepare(model, [{"tensor_fqn": "0.weight"}, {"tensor_fqn": "2.weight"}])
        if epoch == args.epochs - 1 and sparsifier is not None:
            sparsifier.squash_mask()
            sparsifier = None
        for i in range(0, 96, 12):
            loss = F.cross_entropy(model(x[i:i + 12]), y[i:i + 12])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if sparsifier is not None and step % 5 == 0:
                done = min(1.0, (step - 8) / 24)
                level = 0.8 * (1 - (1 - done) ** 3)
                for group in sparsifier.groups:
                    group["sparsity_level"] = level
                sparsifier.step()
                levels.append(round(level, 6))
            progress(step)
    zeros = [(m.weight == 0).sum().item() for m in model if isinstance(m, nn.Linear)]
    finish(model=model.state_dict(), levels=levels, zeros=zeros)


if __name__ == "__main__":
    main()
