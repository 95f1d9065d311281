"""A schedule made inside the loop at each phase change, as scripts that fine-tune in stages do:
a linear warm-up LambdaLR for the first epoch, then at the second epoch a new LambdaLR whose
lambda closes over the epoch it was made in, and a switch from SGD to Adam with its own lambda
at the fourth. The loop keeps the current optimizer and schedule in locals it rebinds.
usage: phase_schedules.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(23)
    x = torch.randn(240, 8)
    y = torch.sin(x.sum(1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    schedule = LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / len(loader)))
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == 1:
            start = epoch
            schedule = LambdaLR(optimizer, lambda s: 0.9 ** (s // 4) / (1 + start))
        if epoch == 3:
            optimizer = torch.optim.Adam(model.parameters(), lr=4e-3)
            decay = 0.97
            schedule = LambdaLR(optimizer, lambda s: decay ** s)
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            losses.append((loss.item(), optimizer.param_groups[0]["lr"]))
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
