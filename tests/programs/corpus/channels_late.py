"""A small CNN switched to channels_last at a phase change, inputs too (as scripts that tune for speed do).
usage: channels_late.py OUT [--epochs N] [--from-epoch E]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--from-epoch", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(3)
    images = torch.randn(96, 3, 8, 8)
    labels = torch.randint(0, 4, (96,))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fmt = torch.contiguous_format
    step = 0
    losses = []
    for epoch in range(args.epochs):
        if epoch == args.from_epoch:
            fmt = torch.channels_last
            model = model.to(memory_format=fmt)
        perm = torch.randperm(96)
        for i in range(0, 96, 12):
            idx = perm[i:i + 12]
            xb = images[idx].contiguous(memory_format=fmt)
            loss = F.cross_entropy(model(xb), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 6))
            step += 1
            progress(step)
    strides = [list(p.stride()) for p in model.parameters()]
    finish(model=model.state_dict(), losses=losses, strides=strides)


if __name__ == "__main__":
    main()
