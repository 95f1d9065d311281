"""Per-parameter settings kept in containers keyed by the parameters, made at a phase change as
layer-wise fine-tuning scripts make them: from --phase-epoch on, gradient multipliers in a dict
keyed by each parameter and read with `.get(p, 1.0)` (`dict`), a set of the parameters whose
gradients are clipped, tested with `in` (`set`), or parameter names in a dict keyed by `id(p)`,
deciding which get weight decay (`ids`; `ids-setup`: made in setup), or a set of the ids of the
first layer's parameters, whose gradients are zeroed from then on (`id-set`), or gradient
scales keyed by the `id()` of each linear layer (`module-ids`).
usage: param_keyed.py OUT MODE [--epochs N] [--phase-epoch N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["dict", "set", "ids", "ids-setup", "id-set", "module-ids"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--phase-epoch", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(12)
    x = torch.randn(192, 10)
    y = (x[:, :3].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    multipliers, clipped, names, frozen_ids, layer_scales = {}, set(), {}, set(), {}
    if args.mode == "ids-setup":
        names = {id(p): name for name, p in model.named_parameters()}
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.phase_epoch:
            if args.mode == "dict":
                multipliers = {p: 0.25 for p in model[0].parameters()}
            elif args.mode == "set":
                clipped = set(model[2].parameters())
            elif args.mode == "ids":
                names = {id(p): name for name, p in model.named_parameters()}
            elif args.mode == "id-set":
                frozen_ids = {id(p) for p in model[0].parameters()}
            elif args.mode == "module-ids":
                layer_scales = {id(m): 0.5 for m in model.modules() if isinstance(m, nn.Linear)}
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            with torch.no_grad():
                for m in model.modules():
                    if id(m) in layer_scales:
                        m.weight.grad.mul_(layer_scales[id(m)])
                for p in model.parameters():
                    p.grad.mul_(multipliers.get(p, 1.0))
                    if p in clipped:
                        p.grad.clamp_(-0.01, 0.01)
                    if names.get(id(p), "").endswith("weight"):
                        p.mul_(0.99)
                    if id(p) in frozen_ids:
                        p.grad.zero_()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
