"""Federated averaging, simulated in one process: each round, a few clients (drawn with NumPy)
take a deep copy of the global model, train it for a local epoch on their own shard with an SGD
made for the round, and the global model becomes the mean of their weights, weighted by shard
size. The clients' models and optimizers live only inside the round.
usage: fedavg.py OUT [--rounds N]"""
import argparse
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def client_loaders(n_clients: int, generator: torch.Generator):
    loaders = []
    for c in range(n_clients):
        n = 48 + 16 * c
        x = torch.randn(n, 12, generator=generator) + 0.3 * c
        y = (x[:, 0] - x[:, 1] > 0.3 * c).long()
        loaders.append(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    return loaders


def average(states, weights):
    total = sum(weights)
    return {k: sum(w / total * s[k] for s, w in zip(states, weights)) for k in states[0]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    loaders = client_loaders(5, torch.Generator().manual_seed(9))
    global_model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 2))
    step, history = 0, []
    for rnd in range(args.rounds):
        chosen = rng.choice(len(loaders), size=3, replace=False)
        states, weights = [], []
        for c in chosen:
            local = copy.deepcopy(global_model)
            opt = torch.optim.SGD(local.parameters(), lr=0.05, momentum=0.9)
            for xb, yb in loaders[c]:
                opt.zero_grad()
                loss = F.cross_entropy(local(xb), yb)
                loss.backward()
                opt.step()
                step += 1
                progress(step)
            states.append(local.state_dict())
            weights.append(len(loaders[c].dataset))
        global_model.load_state_dict(average(states, weights))
        history.append((rnd, [int(c) for c in chosen], loss.item()))
    finish(model=global_model.state_dict(), history=history)


if __name__ == "__main__":
    main()
