"""Loss-spike rollback, as large runs do: every 6 steps a copy of the model's and optimizer's state
dicts is kept in memory; a step whose loss is over 3x the running mean loads them back and skips
its batch. Some batches are scaled up to make spikes.
usage: rollback_spike.py OUT [--steps N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(17)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    w = torch.randn(8, 1)
    good = None
    mean = None
    rollbacks = []
    for step in range(1, args.steps + 1):
        xb = torch.randn(32, 8)
        if step % 11 == 0:
            xb = xb * 20
        loss = F.mse_loss(model(xb), xb @ w)
        if mean is not None and loss.item() > 3 * mean and good is not None:
            model.load_state_dict(good[0])
            optimizer.load_state_dict(good[1])
            rollbacks.append(step)
            progress(step)
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.item() if mean is None else 0.9 * mean + 0.1 * loss.item()
        if step % 6 == 0:
            good = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
        progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), rollbacks=rollbacks)


if __name__ == "__main__":
    main()
