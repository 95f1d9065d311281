"""In-memory files, as scripts keep what they write out only at the end: an `io.StringIO` report
of every epoch's metrics, written to report.csv when training is over (`report`), or the best
weights so far serialized into an `io.BytesIO` with torch.save (no deepcopy of the tensors),
starting from the initial weights, loaded back into the model at the end (`best`). A small MLP
regressor, SGD with momentum, a shuffled DataLoader, a held-out set.
usage: memory_buffers.py OUT MODE [--epochs N]"""
import argparse
import csv
import io
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["report", "best"])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(31)
    xs = torch.randn(224, 6)
    ys = xs[:, :2].sum(1, keepdim=True) + 0.3 * torch.randn(224, 1)
    loader = DataLoader(TensorDataset(xs[:160], ys[:160]), batch_size=16, shuffle=True)
    val_x, val_y = xs[160:], ys[160:]
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    report = io.StringIO()
    table = csv.writer(report)
    table.writerow(["epoch", "train_loss", "val_loss"])
    best_loss, best_bytes = float("inf"), io.BytesIO()
    torch.save(model.state_dict(), best_bytes)

    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        with torch.no_grad():
            val_loss = F.mse_loss(model(val_x), val_y).item()
        if args.mode == "report":
            table.writerow([epoch, f"{total / len(loader):.6f}", f"{val_loss:.6f}"])
        elif val_loss < best_loss:
            best_loss = val_loss
            best_bytes.seek(0)
            best_bytes.truncate()
            torch.save(model.state_dict(), best_bytes)

    with open(os.path.join(args.out, "report.csv"), "w") as f:
        f.write(report.getvalue())
    best_bytes.seek(0)
    model.load_state_dict(torch.load(best_bytes))
    finish(model=model.state_dict(), best_loss=best_loss, report=report.getvalue())


if __name__ == "__main__":
    main()
