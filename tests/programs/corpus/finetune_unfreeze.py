"""Fine-tuning as the transfer-learning tutorials write it: a "pretrained" backbone frozen with
`requires_grad = False` while a new head warms up, then unfrozen at a chosen epoch and added to
the optimizer as a parameter group of its own at a tenth of the rate; its batch-norm layers kept
in eval mode throughout (frozen statistics); a last layer frozen again for the final epoch. What
trains at each step is decided by flags on the parameters, set mid-run.
usage: finetune_unfreeze.py OUT [--epochs N] [--unfreeze-at E]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def pretrained_backbone():
    torch.manual_seed(0)  # stands for weights downloaded once
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())


def set_trainable(module, trainable):
    for p in module.parameters():
        p.requires_grad = trainable


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--unfreeze-at", type=int, default=1)
    args = parser.parse_args()

    backbone = pretrained_backbone()
    torch.manual_seed(5)
    head = nn.Linear(32, 3)
    model = nn.Sequential(backbone, head)
    x = torch.randn(192, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)

    set_trainable(backbone, False)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    step = 0
    for epoch in range(args.epochs):
        if epoch == args.unfreeze_at:
            set_trainable(backbone, True)
            optimizer.add_param_group({"params": backbone.parameters(), "lr": 0.005})
        if epoch == args.epochs - 1:
            backbone[3].weight.requires_grad_(False)  # the last block settles for the final epoch
        model.train()
        backbone[1].eval()  # the statistics stay the pretrained ones
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    finish(model=model.state_dict(), trainable=[p.requires_grad for p in model.parameters()])


if __name__ == "__main__":
    main()
