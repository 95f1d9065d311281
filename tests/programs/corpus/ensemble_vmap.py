"""An ensemble of small MLPs trained at once, as torch.func's model-ensembling tutorial does:
stack_module_state, functional_call under vmap, one Adam over the stacked tensors.
usage: ensemble_vmap.py OUT [--epochs N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.dropout(F.relu(self.fc1(x)), 0.1, self.training))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(3)
    x = torch.randn(160, 8)
    y = torch.randint(0, 3, (160,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    models = [MLP() for _ in range(4)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def one(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    optimizer = torch.optim.Adam(params.values(), lr=1e-2)
    step = 0
    history = []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            logits = vmap(one, in_dims=(0, 0, None), randomness="different")(params, buffers, xb)
            loss = sum(F.cross_entropy(l, yb) for l in logits)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            history.append(loss.item())
            progress(step)
    finish(params={k: v.detach() for k, v in params.items()}, history=history, optimizer=optimizer.state_dict())


if __name__ == "__main__":
    main()
