"""Evaluation off the training thread, as scripts do to keep the loop busy: every few steps a
deep copy of the model goes to a one-thread ThreadPoolExecutor, whose futures wait in a list;
at each epoch's end the script gathers their results into its history and clears the list.
SGD with Nesterov momentum over a shuffled DataLoader.
usage: async_eval.py OUT [--epochs N]"""
import argparse
import copy
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    return F.cross_entropy(model(x), y).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(4)
    x = torch.randn(256, 8)
    y = (x @ torch.randn(8, 3)).argmax(dim=1)
    val_x, val_y = x[:64] + 0.05 * torch.randn(64, 8), y[:64]
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    pool = ThreadPoolExecutor(max_workers=1)
    pending, history, losses, step = [], [], [], 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % 5 == 0:
                pending.append((step, pool.submit(evaluate, copy.deepcopy(model), val_x, val_y)))
            progress(step)
        history.extend((s, f.result()) for s, f in pending)
        pending.clear()
    pool.shutdown()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, history=history)


if __name__ == "__main__":
    main()
