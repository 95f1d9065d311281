"""Differentially private SGD by hand: Poisson-sampled batches (a numpy Generator draws each
example's inclusion), per-example gradients with torch.func (`vmap(grad(loss))` over
`functional_call`), each clipped to a norm, summed, and noised from a torch.Generator the
script keeps in a dict of its privacy settings; a privacy budget spent per step.
usage: dp_sgd.py OUT [--steps N]"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    torch.manual_seed(2)
    n = 400
    x = torch.randn(n, 6)
    y = (x[:, :2].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    privacy = {"clip": 1.0, "noise": 0.8, "rate": 0.05, "noise_gen": torch.Generator().manual_seed(99), "spent": 0.0}
    sampler = np.random.default_rng(7)
    lr = 0.5

    params = {k: v.detach() for k, v in model.named_parameters()}

    def example_loss(p, xi, yi):
        logits = functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(logits, yi.unsqueeze(0))

    per_example_grads = vmap(grad(example_loss), in_dims=(None, 0, 0))
    history = []
    for step in range(args.steps):
        chosen = np.nonzero(sampler.random(n) < privacy["rate"])[0]
        if len(chosen) == 0:
            continue
        idx = torch.from_numpy(chosen)
        grads = per_example_grads(params, x[idx], y[idx])
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
        scale = (privacy["clip"] / (norms + 1e-6)).clamp(max=1.0)
        expected = privacy["rate"] * n
        for name, g in grads.items():
            summed = (g * scale.view(-1, *[1] * (g.dim() - 1))).sum(0)
            noise = torch.normal(0.0, privacy["noise"] * privacy["clip"], size=summed.shape, generator=privacy["noise_gen"])
            params[name] = params[name] - lr * (summed + noise) / expected
        privacy["spent"] += math.sqrt(privacy["rate"]) / privacy["noise"]
        with torch.no_grad():
            history.append(F.cross_entropy(functional_call(model, params, (x,)), y).item())
        progress(step + 1)
    finish(params=params, history=history, spent=privacy["spent"])


if __name__ == "__main__":
    main()
