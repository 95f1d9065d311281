"""Evolution strategies without autograd or an optimizer, as the OpenAI ES recipe is written: the
policy's parameters flattened with `parameters_to_vector`, a population of antithetic noise drawn
from a NumPy RandomState the script owns, each candidate written back with
`vector_to_parameters` (which leaves every parameter a view of the candidate vector) and scored
on a fixed batch, fitness shaped by rank, and the mean moved with momentum kept by hand.
usage: evolution_strategies.py OUT [--generations N]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from common import finish, progress


def centered_ranks(x):
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[x.argsort()] = np.arange(len(x))
    return ranks / (len(x) - 1) - 0.5


@torch.no_grad()
def fitness(policy, x, y):
    return -torch.nn.functional.mse_loss(policy(x), y).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--generations", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(2)
    noise_rng = np.random.RandomState(123)
    x = torch.randn(64, 4)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    theta = parameters_to_vector(policy.parameters()).detach().numpy().astype(np.float64)
    velocity = np.zeros_like(theta)
    sigma, lr, half = 0.05, 0.03, 12
    history = []
    for generation in range(args.generations):
        eps = noise_rng.randn(half, theta.size)
        eps = np.concatenate([eps, -eps])
        scores = np.empty(len(eps))
        for i, e in enumerate(eps):
            vector_to_parameters(torch.from_numpy(theta + sigma * e).float(), policy.parameters())
            scores[i] = fitness(policy, x, y)
        weights = centered_ranks(scores)
        gradient = weights @ eps / (len(eps) * sigma)
        velocity = 0.9 * velocity + gradient
        theta = theta + lr * velocity
        vector_to_parameters(torch.from_numpy(theta).float(), policy.parameters())
        history.append((float(scores.mean()), fitness(policy, x, y)))
        progress(generation + 1)
    finish(policy=policy.state_dict(), theta=torch.from_numpy(theta), velocity=torch.from_numpy(velocity),
           history=history)


if __name__ == "__main__":
    main()
