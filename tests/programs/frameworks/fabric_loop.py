"""A Lightning Fabric loop: Fabric(accelerator="cpu") sets up a model and Adam, wraps a shuffled
DataLoader (`setup_dataloaders`), steps with `fabric.backward`, and keeps its metrics in
torchmetrics objects, a MetricCollection of accuracy and F1 updated every batch and a MeanMetric
of the loss, computed, logged and reset at each epoch's end; a cosine schedule per epoch. With
--distributed-sampler the loader shuffles through a DistributedSampler (one replica), whose
order Fabric sets per epoch, as it does for the sampler it puts in a multi-process run's loader.
With --workers N, N DataLoader workers load the samples, each jittered with noise drawn in the
worker (an augmentation).
usage: fabric_loop.py OUT [--epochs N] [--distributed-sampler] [--workers N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from common import finish, progress


class Jittered(TensorDataset):
    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x + 0.05 * torch.randn_like(x), y


def main():
    parser = argparse.ArgumentParser(description="a small classifier under Lightning Fabric")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--distributed-sampler", action="store_true", help="shuffle through a DistributedSampler")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers, which jitter each sample")
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    fabric.seed_everything(11)
    centers = torch.randn(4, 12) * 1.5
    y = torch.randint(4, (160,))
    x = centers[y] + torch.randn(160, 12)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    model, optimizer = fabric.setup(model, optimizer)
    dataset = Jittered(x, y) if args.workers else TensorDataset(x, y)
    if args.distributed_sampler:
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=5)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=args.workers)
    else:
        loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=args.workers)
    loader = fabric.setup_dataloaders(loader)
    metrics = MetricCollection({"acc": MulticlassAccuracy(num_classes=4), "f1": MulticlassF1Score(num_classes=4)})
    mean_loss = MeanMetric()

    history, step = [], 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            metrics.update(logits.detach(), yb)
            mean_loss.update(loss.detach())
            step += 1
            progress(step)
        scheduler.step()
        computed = {name: value.item() for name, value in metrics.compute().items()}
        computed["loss"] = mean_loss.compute().item()
        fabric.print(f"epoch {epoch}: {computed}")
        history.append(computed)
        metrics.reset()
        mean_loss.reset()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history)


if __name__ == "__main__":
    main()
