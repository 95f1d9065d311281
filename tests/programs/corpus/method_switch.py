"""A trainer object that switches its own methods at phase changes: the loss from `self.mse` to
`self.huber` after a warm-up, and the validation score from `self.top1` to `self.top3` once the
classes grow harder to tell apart (with --score-only, only the score). The scores logged each
epoch are part of the final state.
usage: method_switch.py OUT [--epochs N] [--score-only]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        self.loss_fn = self.mse
        self.score = self.top1

    def mse(self, logits, y):
        return F.mse_loss(logits.softmax(-1), F.one_hot(y, logits.shape[-1]).float())

    def huber(self, logits, y):
        return F.smooth_l1_loss(logits.softmax(-1), F.one_hot(y, logits.shape[-1]).float(), beta=0.1)

    def top1(self, logits, y):
        return (logits.argmax(-1) == y).float().mean().item()

    def top3(self, logits, y):
        return (logits.topk(3, -1).indices == y[:, None]).any(-1).float().mean().item()

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
    parser.add_argument("--score-only", action="store_true", help="switch the score, keep the loss")
    args = parser.parse_args()
    torch.manual_seed(6)
    X, Y = torch.randn(240, 10), torch.randint(0, 6, (240,))
    Xv, Yv = torch.randn(60, 10), torch.randint(0, 6, (60,))
    trainer = Trainer(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 6)))
    log = open(os.path.join(args.out, "scores.log"), "w")
    step = 0
    for epoch in range(args.epochs):
        if epoch == 1 and not args.score_only:
            trainer.loss_fn = trainer.huber
        if epoch == 2:
            trainer.score = trainer.top3
        perm = torch.randperm(240)
        for i in range(0, 240, 24):
            idx = perm[i:i + 24]
            loss = trainer.step(X[idx], Y[idx])
            step += 1
            progress(step)
        with torch.no_grad():
            score = trainer.score(trainer.model(Xv), Yv)
        log.write(f"epoch {epoch} loss {loss:.6f} {trainer.score.__name__} {score:.4f}\n")
        log.flush()
    log.close()
    with open(os.path.join(args.out, "scores.log")) as f:
        lines = f.read().splitlines()
    finish(model=trainer.model.state_dict(), lines=lines)


if __name__ == "__main__":
    main()
