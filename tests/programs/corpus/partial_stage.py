"""Curriculum stages that rebind partials: the augmentation `augment = partial(jitter, strength=s)`
grows its strength at each stage, and the loss the trainer object holds becomes
`partial(F.smooth_l1_loss, beta=0.5)` at stage 2 (it was beta=1.0). The log's lines are part of the
final state.
usage: partial_stage.py OUT [--epochs N]"""
import argparse
import os
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def jitter(x, strength):
    return x + strength * torch.randn_like(x)


class Trainer:
    def __init__(self, model, loss_fn):
        self.model = model
        self.loss_fn = loss_fn
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(4)
    trainer = Trainer(nn.Linear(5, 1), partial(F.smooth_l1_loss, beta=1.0))
    augment = partial(jitter, strength=0.0)
    log = open(os.path.join(args.out, "train.log"), "w")
    step = 0
    for epoch in range(args.epochs):
        if epoch >= 1:
            augment = partial(jitter, strength=0.1 * epoch)
        if epoch == 2:
            trainer.loss_fn = partial(F.smooth_l1_loss, beta=0.5)
        for _ in range(8):
            x = torch.randn(16, 5)
            loss = trainer.step(augment(x), x.sum(1, keepdim=True))
            step += 1
            log.write(f"step {step} strength {augment.keywords['strength']:.1f} loss {loss:.6f}\n")
            log.flush()
            progress(step)
    log.close()
    with open(os.path.join(args.out, "train.log")) as f:
        lines = f.read().splitlines()
    finish(model=trainer.model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
