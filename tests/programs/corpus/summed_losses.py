"""Gradient accumulation by summing the losses: `window = window + loss / accum` over four
micro-batches, then one `window.backward()` and a step. Between steps the sum holds the
autograd graph of the micro-batches already run. Batches from a shuffled DataLoader, SGD with
momentum, a running mean of the loss kept as a tensor.
usage: summed_losses.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(4)
    x = torch.randn(512, 10)
    y = x @ torch.randn(10, 1) + 0.1 * torch.randn(512, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 24), nn.GELU(), nn.Linear(24, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    steps, micro, window, losses = 0, 0, 0.0, []
    running = torch.zeros(())
    while steps < args.steps:
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            window = window + loss / args.accum
            running = 0.9 * running + 0.1 * loss.detach()
            micro += 1
            if micro % args.accum == 0:
                optimizer.zero_grad()
                window.backward()
                optimizer.step()
                losses.append(window.item())
                window = 0.0
                steps += 1
                progress(steps)
                if steps == args.steps:
                    break
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, running=running)


if __name__ == "__main__":
    main()
