"""A stream of batches, each new batch given an id by `new_id = itertools.count().__next__` (the
unique-id idiom) and its loss kept under that id for hard-example mining; each epoch's loss sum
accumulates through `accumulate = epoch_total.add_`, a method of that epoch's tensor.
usage: sample_ids.py OUT [--epochs N]"""
import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    new_id = itertools.count().__next__
    losses, totals, step = {}, [], 0
    for epoch in range(args.epochs):
        epoch_total = torch.zeros(())
        accumulate = epoch_total.add_
        for _ in range(10):
            x = torch.randn(8, 8)
            y = x[:, :2].sum(1, keepdim=True)
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[new_id()] = round(loss.item(), 6)
            accumulate(loss.detach())
            step += 1
            progress(step)
        totals.append(epoch_total.item())
    hardest = sorted(losses, key=losses.get)[-5:]
    finish(model=model.state_dict(), losses=losses, totals=totals, hardest=hardest)


if __name__ == "__main__":
    main()
