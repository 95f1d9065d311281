"""torchmetrics in a plain loop: a MetricCollection (accuracy, F1, a confusion matrix) updated each
step and computed and reset each epoch, a MeanMetric for the loss, and a MaxMetric keeping the best
accuracy across epochs.
usage: metrics_collection.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(47)
    x = torch.randn(150, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=15, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    metrics = torchmetrics.MetricCollection({
        "acc": torchmetrics.Accuracy(task="multiclass", num_classes=3),
        "f1": torchmetrics.F1Score(task="multiclass", num_classes=3, average="macro"),
        "confusion": torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3),
    })
    mean_loss = torchmetrics.MeanMetric()
    best = torchmetrics.MaxMetric()
    history = []
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            metrics.update(logits.detach(), yb)
            mean_loss.update(loss.detach())
            step += 1
            progress(step)
        computed = metrics.compute()
        best.update(computed["acc"])
        history.append({"loss": mean_loss.compute(), **computed})
        metrics.reset()
        mean_loss.reset()
    finish(model=model.state_dict(), history=history, best=best.compute())


if __name__ == "__main__":
    main()
