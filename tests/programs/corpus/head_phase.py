"""A second head joins at a phase change, with an optimizer and a schedule of its own made then:
`aux_optimizer = None` in setup; from --phase-epoch on, an auxiliary regression head trains on
the shared features with Adam and a StepLR, both made in the loop, while the backbone keeps its
SGD. Written as multi-task scripts grow: the new parts start as None and are checked each step.
usage: head_phase.py OUT [--epochs N] [--phase-epoch N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--phase-epoch", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(6)
    x = torch.randn(160, 8)
    labels = (x[:, 0] > 0).long()
    targets = x[:, 1:2] * x[:, 2:3]
    loader = DataLoader(TensorDataset(x, labels, targets), batch_size=16, shuffle=True)
    backbone = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
    classifier = nn.Linear(32, 2)
    optimizer = torch.optim.SGD([*backbone.parameters(), *classifier.parameters()], lr=0.05, momentum=0.9)
    aux_head, aux_optimizer, aux_schedule = None, None, None
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.phase_epoch:
            aux_head = nn.Linear(32, 1)
            aux_optimizer = torch.optim.Adam(aux_head.parameters(), lr=1e-2)
            aux_schedule = torch.optim.lr_scheduler.StepLR(aux_optimizer, step_size=7, gamma=0.5)
        for xb, yb, tb in loader:
            features = backbone(xb)
            loss = F.cross_entropy(classifier(features), yb)
            if aux_head is not None:
                loss = loss + F.mse_loss(aux_head(features), tb)
                aux_optimizer.zero_grad()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if aux_optimizer is not None:
                aux_optimizer.step()
                aux_schedule.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(backbone=backbone.state_dict(), classifier=classifier.state_dict(), aux=aux_head.state_dict(),
           aux_optimizer=aux_optimizer.state_dict(), aux_schedule=aux_schedule.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
