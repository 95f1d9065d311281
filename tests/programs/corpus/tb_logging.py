"""Logging to TensorBoard the way the PyTorch tutorials do: a SummaryWriter made in setup (its
event file named by the time, the host and the process id; a background thread writes it),
add_scalar every step, add_histogram of the weights every few steps, add_scalars of a running
accuracy, flush at each epoch's end, close at the end; a LeNet-style classifier on synthetic
images, with a StepLR.
usage: tb_logging.py OUT [--epochs N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

from common import finish, progress


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--grouped", action="store_true", help="also add_scalars, which makes a writer per tag as it goes")
    args = parser.parse_args()

    torch.manual_seed(31)
    images = torch.randn(480, 1, 28, 28)
    labels = (images[:, 0, 10:18, 10:18].mean((1, 2)) * 40).long().clamp(0, 9)
    loader = DataLoader(TensorDataset(images, labels), batch_size=24, shuffle=True)
    model = LeNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    writer = SummaryWriter(os.path.join(args.out, "runs"))

    step, correct, seen = 0, 0, 0
    for epoch in range(args.epochs):
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
            writer.add_scalar("train/loss", loss.item(), step)
            if args.grouped:
                writer.add_scalars("train/accuracy", {"running": correct / seen}, step)
            if step % 10 == 0:
                for name, param in model.named_parameters():
                    writer.add_histogram(name, param, step)
            step += 1
            progress(step)
        scheduler.step()
        writer.add_scalar("lr", scheduler.get_last_lr()[0], epoch)
        writer.flush()
    writer.close()

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
           correct=correct, seen=seen)


if __name__ == "__main__":
    main()
