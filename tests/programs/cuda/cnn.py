"""A small CNN on synthetic images: AdamW, a shuffled DataLoader, BatchNorm, and a frozen
embedding table that never changes (its device chunks stay clean). usage: cnn.py OUT STEPS"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpu import DEVICE, finish, on_cpu, progress


def make_data(n: int = 512):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g))


def main(steps: int) -> None:
    torch.manual_seed(0)
    loader = DataLoader(make_data(), batch_size=32, shuffle=True)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).to(DEVICE)
    table = nn.Embedding(8192, 256).to(DEVICE).requires_grad_(False)  # 8 MiB the training never writes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = 0
    losses = []
    for epoch in range(10_000):
        for x, y in loader:
            x, y = x.to(DEVICE), y.to(DEVICE)
            bias = table.weight[y % 8192, :10]
            loss = nn.functional.cross_entropy(model(x) + 0.01 * bias, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            step += 1
            progress(step)
            if step == steps:
                finish(model=on_cpu(model.state_dict()), optimizer=on_cpu(optimizer.state_dict()["state"]),
                       losses=on_cpu(torch.stack(losses)), table=on_cpu(table.weight))
                return


if __name__ == "__main__":
    main(int(sys.argv[2]))
