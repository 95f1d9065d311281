"""An Accelerate loop over a streaming dataset: a torch IterableDataset that draws examples from its
own generator, seeded per epoch through set_epoch (which Accelerate's loader calls), prepared with
the model and optimizer; accelerator.accumulate over two micro-batches, a fixed number of epochs.
With --workers N the DataLoader has N workers, each streaming its own share.
usage: accelerate_stream.py OUT [--epochs N] [--workers N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from accelerate import Accelerator
from common import finish, progress
from torch import nn


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, per_epoch=160):
        self.per_epoch, self.epoch = per_epoch, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        shard, shards = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        g = torch.Generator().manual_seed(100 * self.epoch + shard)
        for _ in range(self.per_epoch // shards):
            x = torch.randn(6, generator=g)
            yield x, (x[:2].sum() > 0).long()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 24), nn.GELU(), nn.Dropout(0.1), nn.Linear(24, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=8, num_workers=args.workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, step = [], 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=accelerator.unwrap_model(model).state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
