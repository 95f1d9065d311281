"""Stochastic weight averaging switched on late, as scripts that add it to a finished recipe do:
`swa_model = swa_scheduler = None` in setup; at --swa-start, an AveragedModel of the network
(equal weights, the default averaging) and a SWALR schedule are made, then updated after each
epoch; batch-norm statistics recomputed for the average with update_bn at the end. A small CNN
with batch norm, SGD with Nesterov momentum and weight decay, a shuffled DataLoader.
usage: swa_late.py OUT [--epochs N] [--swa-start E]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--swa-start", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(16)
    images = torch.randn(128, 1, 8, 8)
    labels = (images.mean((1, 2, 3)) > 0).long()
    loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 36, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    swa_model = swa_scheduler = None
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.swa_start:
            swa_model = AveragedModel(model)
            swa_scheduler = SWALR(optimizer, swa_lr=0.01, anneal_epochs=1)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        if swa_model is not None:
            swa_model.update_parameters(model)
            swa_scheduler.step()
    update_bn(loader, swa_model)
    finish(model=model.state_dict(), swa=swa_model.state_dict(), optimizer=optimizer.state_dict(),
           schedule=swa_scheduler.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
