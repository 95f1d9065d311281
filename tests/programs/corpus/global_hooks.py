"""A hook for every module, registered at a phase change, as scripts that start collecting
activation statistics late do: from the second epoch on, `register_module_forward_hook` counts
the rows each Tanh puts out (torch keeps such hooks in its own module's globals). With
`--optimizer`, `register_optimizer_step_post_hook` counts every optimizer's steps instead (torch
keeps those in torch.optim.optimizer's globals). An MLP, SGD, a shuffled DataLoader; the model
and the count are the output.
usage: global_hooks.py OUT [--epochs N] [--from-epoch E] [--optimizer]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--from-epoch", type=int, default=1)
    parser.add_argument("--optimizer", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(5)
    x = torch.randn(160, 8)
    y = (x[:, :2].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {"tanh": 0, "steps": 0}

    def count_rows(module, inputs, output):
        if isinstance(module, nn.Tanh):
            seen["tanh"] += output.shape[0]

    def count_steps(opt, args, kwargs):
        seen["steps"] += 1

    step = 0
    for epoch in range(args.epochs):
        if epoch == args.from_epoch:
            if args.optimizer:
                register_optimizer_step_post_hook(count_steps)
            else:
                nn.modules.module.register_module_forward_hook(count_rows)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), seen=seen)


if __name__ == "__main__":
    main()
