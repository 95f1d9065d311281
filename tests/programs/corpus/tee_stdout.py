"""Everything the script prints goes to the terminal and to a log file too, through a Tee object
put in place of sys.stdout at start, as many research scripts do; the log is read back at the end.
--late puts the Tee in place at the second epoch (logging set up once the first has shown the
run is sound). An MLP, SGD with momentum, a shuffled DataLoader.
usage: tee_stdout.py OUT [--epochs N] [--late]"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Tee:
    def __init__(self, path):
        self.terminal = sys.stdout
        self.log = open(path, "a")

    def write(self, message):
        self.terminal.write(message)
        self.log.write(message)

    def flush(self):
        self.terminal.flush()
        self.log.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--late", action="store_true")
    args = parser.parse_args()

    path = os.path.join(args.out, "train.log")
    open(path, "w").close()
    if not args.late:
        sys.stdout = Tee(path)
    print("start")
    torch.manual_seed(31)
    x = torch.randn(192, 10)
    y = (x[:, 1:5].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(args.epochs):
        if args.late and epoch == 1:
            sys.stdout = Tee(path)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            progress(step)

    sys.stdout.log.close()
    sys.stdout = sys.stdout.terminal
    with open(path) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
