"""A model whose forward is patched mid-run: after the warm-up, `model.forward` becomes a
module-level function bound by hand (types.MethodType) that adds input noise; with --local,
a function made inside main() over a local scale.
usage: patched_forward.py OUT [--epochs N] [--local]"""
import argparse
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def noisy_forward(self, x):
    return nn.Sequential.forward(self, x + 0.1 * torch.randn_like(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--local", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    X, Y = torch.randn(160, 6), torch.randn(160, 1)
    scale = 0.3
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == 2:
            if args.local:
                def scaled_forward(self, x):
                    return nn.Sequential.forward(self, x) * scale
                model.forward = types.MethodType(scaled_forward, model)
            else:
                model.forward = types.MethodType(noisy_forward, model)
        for i in range(0, 160, 16):
            loss = F.mse_loss(model(X[i:i + 16]), Y[i:i + 16])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 6))
            step += 1
            progress(step)
    with torch.no_grad():
        evaluation = model(X[:8]).squeeze(1).tolist()
    finish(model=model.state_dict(), losses=losses, evaluation=evaluation)


if __name__ == "__main__":
    main()
