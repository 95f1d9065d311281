"""The train step swapped at a phase change (the second epoch), the loop calling whichever
`train_step` holds: a closure a factory returns over the model, the optimizer, a loss scale and
a count of its calls (`--style closure`), or a functional step defined there over
`torch.func.grad` of a loss through `functional_call` (`--style func`).
usage: step_factory.py OUT [--style closure|func]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def make_step(model, optimizer, scale):
    calls = 0

    def train_step(xb, yb):
        nonlocal calls
        calls += 1
        loss = F.mse_loss(model(xb), yb) * scale
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item(), calls

    return train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--style", choices=["closure", "func"], default="closure")
    args = parser.parse_args()
    torch.manual_seed(8)
    x = torch.randn(128, 5)
    y = x @ torch.randn(5, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    losses = []

    def plain_step(xb, yb):
        loss = F.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item(), step

    train_step = plain_step
    for epoch in range(5):
        if epoch == 1 and args.style == "closure":
            train_step = make_step(model, optimizer, 0.5)
        if epoch == 1 and args.style == "func":
            def loss_of(params, xb, yb):
                return F.mse_loss(functional_call(model, params, (xb,)), yb)
            grads_of = grad(loss_of)

            def train_step(xb, yb):
                params = dict(model.named_parameters())
                grads = grads_of({k: v.detach() for k, v in params.items()}, xb, yb)
                with torch.no_grad():
                    for k, p in params.items():
                        p -= 0.05 * grads[k]
                return loss_of(params, xb, yb).item(), 0
        for xb, yb in loader:
            losses.append(train_step(xb, yb))
            step += 1
            progress(step)
    finish(model=model.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
