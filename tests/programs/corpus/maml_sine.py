"""MAML on sine regression, written with torch.func: each meta-step draws a batch of tasks
(amplitude and phase from a NumPy RandomState), adapts the weights to each task's support set
by a few functional SGD steps whose graph is kept, and steps Adam on the query loss of the
adapted weights. The meta-parameters are a plain dict of leaf tensors, no nn.Module holds them.
usage: maml_sine.py OUT [--steps N]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call

from common import finish, progress


def sample_task(rs: np.random.RandomState, k: int):
    amplitude, phase = rs.uniform(0.1, 5.0), rs.uniform(0, np.pi)
    x = rs.uniform(-5, 5, size=(2 * k, 1)).astype(np.float32)
    y = (amplitude * np.sin(x + phase)).astype(np.float32)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    return (x[:k], y[:k]), (x[k:], y[k:])


def adapt(net, params, support, inner_lr: float, inner_steps: int):
    x, y = support
    for _ in range(inner_steps):
        loss = nn.functional.mse_loss(functional_call(net, params, (x,)), y)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        params = {name: p - inner_lr * g for (name, p), g in zip(params.items(), grads)}
    return params


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(2)
    rs = np.random.RandomState(2)
    net = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    meta_params = {name: p.detach().clone().requires_grad_() for name, p in net.named_parameters()}
    meta_opt = torch.optim.Adam(meta_params.values(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        meta_opt.zero_grad()
        query_loss = 0.0
        for _ in range(4):
            support, query = sample_task(rs, 10)
            adapted = adapt(net, meta_params, support, inner_lr=0.01, inner_steps=2)
            xq, yq = query
            query_loss = query_loss + nn.functional.mse_loss(functional_call(net, adapted, (xq,)), yq)
        (query_loss / 4).backward()
        meta_opt.step()
        losses.append(query_loss.item() / 4)
        progress(step + 1)
    finish(params={k: v.detach() for k, v in meta_params.items()}, optimizer=meta_opt.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
