"""A torch.compile'd model (inductor, the default backend: on CPU it builds C++ kernels, about
20 s cold and 4-5 s with a warm inductor cache on the 2-core machine), trained with Adam over a
shuffled DataLoader. Kept apart from furniture.py for that cost.
usage: compiled.py OUT [--epochs N] [--backend inductor|aot_eager|eager]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 64)
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        x = F.silu(self.fc1(x))
        x = F.silu(self.fc2(x)) + x
        return self.out(x)


def main():
    parser = argparse.ArgumentParser(description="a torch.compile'd regression model")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()

    torch.manual_seed(7)
    x = torch.randn(240, 16)
    y = torch.sin(x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)
    model = MLP()
    compiled = torch.compile(model, backend=args.backend)
    optimizer = torch.optim.Adam(compiled.parameters(), lr=3e-3)

    step = 0
    losses = []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(compiled(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
