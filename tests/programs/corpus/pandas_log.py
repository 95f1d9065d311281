"""Each epoch's metrics appended to a CSV with pandas (`to_csv(mode="a")`, the header written once),
and a per-step DataFrame built from a list of dicts, read back with read_csv at the end.
usage: pandas_log.py OUT [--epochs N]"""
import argparse
import os

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    path = os.path.join(args.out, "epochs.csv")
    torch.manual_seed(43)
    x = torch.randn(120, 6)
    y = x[:, :2].sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = []
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            rows.append({"epoch": epoch, "step": step, "loss": loss.item()})
            progress(step)
        frame = pd.DataFrame(rows)
        summary = frame[frame.epoch == epoch].agg({"loss": ["mean", "min", "max"]}).T
        summary.insert(0, "epoch", epoch)
        summary.to_csv(path, mode="a", header=not os.path.exists(path), index=False, float_format="%.6f")
    back = pd.read_csv(path)
    finish(model=model.state_dict(), epochs=back.to_dict("list"), steps=pd.DataFrame(rows).round(6).to_dict("list"))


if __name__ == "__main__":
    main()
