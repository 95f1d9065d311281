"""Pretraining then fine-tuning through one `train` function called twice, as small research
scripts do: a denoising pretext task (predict the clean inputs from corrupted ones) on unlabeled
data with its own optimizer, then the encoder kept, a classification head put on it, and the
same function run again on the labeled data with a new optimizer and a step-decay schedule.
A snapshot lands in either call; the loops of both are the same statements.
usage: pretrain_finetune.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def train(model, loader, optimizer, loss_fn, epochs, step, scheduler=None):
    model.train()
    losses = []
    for epoch in range(epochs):
        for inputs, targets in loader:
            loss = loss_fn(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        if scheduler is not None:
            scheduler.step()
    return step, losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(17)
    unlabeled = torch.randn(128, 10)
    corrupted = unlabeled * (torch.rand_like(unlabeled) > 0.2)
    pretext = DataLoader(TensorDataset(corrupted, unlabeled), batch_size=16, shuffle=True)
    x = torch.randn(96, 10)
    y = (x[:, :3].sum(1) > 0).long()
    labeled = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)

    encoder = nn.Sequential(nn.Linear(10, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU())
    autoencoder = nn.Sequential(encoder, nn.Linear(24, 10))
    step, pre_losses = train(autoencoder, pretext, torch.optim.Adam(autoencoder.parameters(), lr=3e-3),
                             nn.MSELoss(), args.epochs, 0)

    classifier = nn.Sequential(encoder, nn.Dropout(0.1), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    step, ft_losses = train(classifier, labeled, optimizer, nn.CrossEntropyLoss(), args.epochs, step, scheduler)
    finish(model=classifier.state_dict(), pre_losses=pre_losses, ft_losses=ft_losses, steps=step)


if __name__ == "__main__":
    main()
