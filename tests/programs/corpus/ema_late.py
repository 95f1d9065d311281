"""An EMA started at a phase change, as recipes that add one after warm-up do: `ema = None` in
setup; at --ema-epoch, `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))`, updated
after every step. torch's EMA function is a closure over the decay inside a `torch.no_grad()`
decorator's wrapper: two local functions of library code, made in that step.
usage: ema_late.py OUT [--epochs N] [--ema-epoch N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--ema-epoch", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(5)
    x = torch.randn(160, 6)
    y = x @ torch.randn(6, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ema = None
    step = 0
    for epoch in range(args.epochs):
        if epoch == args.ema_epoch:
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if ema is not None:
                ema.update_parameters(model)
            step += 1
            progress(step)
    finish(model=model.state_dict(), ema=ema.state_dict())


if __name__ == "__main__":
    main()
