"""An epoch of training, then a slow evaluation, each a function of its own (as the ImageNet
example writes them): a snapshot asked for while it evaluates lands at a boundary of the
evaluation's loop, after that epoch's training loop has run its course. OUT/phase says
"eval E" while epoch E evaluates. usage: eval_between.py OUT [EPOCHS]"""
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import OUT, finish, progress
from torch.utils.data import DataLoader, TensorDataset


def train_one_epoch(model, loader, optimizer, step):
    model.train()
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        progress(step)
    return step


def evaluate(model, loader, epoch):
    model.eval()
    correct = 0
    with open(os.path.join(OUT, "phase"), "w") as f:
        f.write(f"eval {epoch}")
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            time.sleep(0.15)  # a validation set larger than the training steps between them: 2.4 s
    with open(os.path.join(OUT, "phase"), "w") as f:
        f.write(f"train {epoch + 1}")
    return correct / len(loader.dataset)


def main():
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.manual_seed(3)
    x, xv = torch.randn(96, 8), torch.randn(64, 8)
    y, yv = (x[:, 0] > 0).long(), (xv[:, 0] > 0).long()
    train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(xv, yv), batch_size=4)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.8)
    step, accuracies = 0, []
    for epoch in range(epochs):
        step = train_one_epoch(model, train, optimizer, step)
        accuracies.append(evaluate(model, val, epoch))
        scheduler.step()
    finish(model=model.state_dict(), accuracies=accuracies, step=step)


main()
