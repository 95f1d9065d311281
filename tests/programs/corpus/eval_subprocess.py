"""Each epoch's weights are saved and a separate evaluation process is run on them, as scripts
that shell out to an eval script do; the evaluator appends its line to results.txt, read back at
the end. An MLP, SGD, a shuffled DataLoader.
usage: eval_subprocess.py OUT [--epochs N]"""
import argparse
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

EVALUATE = """
import sys, torch
state = torch.load(sys.argv[1])
total = sum(float(v.abs().sum()) for v in state.values())
with open(sys.argv[2], "a") as f:
    f.write(f"{sys.argv[3]} {total:.6f}\\n")
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    results = os.path.join(args.out, "results.txt")
    torch.manual_seed(41)
    x = torch.randn(192, 10)
    y = (x[:, 3:7].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        weights = os.path.join(args.out, "epoch.pt")
        torch.save(model.state_dict(), weights)
        subprocess.run([sys.executable, "-c", EVALUATE, weights, results, str(epoch)], check=True)

    with open(results) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
