"""An EarlyStopping class in the style of the popular snippet: it keeps a counter and the best
validation loss, torch.save's the whole model to checkpoint.pt when it improves, and sets
early_stop after `patience` epochs without; the loop breaks on it, loads the best model back with
torch.load and reports. Steps that give a non-finite loss are skipped inside try/except.
usage: early_stop.py OUT [--epochs N] [--patience P]"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class EarlyStopping:
    def __init__(self, patience, path):
        self.patience = patience
        self.counter = 0
        self.best_score = None
        self.early_stop = False
        self.val_loss_min = np.inf
        self.path = path

    def __call__(self, val_loss, model):
        score = -val_loss
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            torch.save(model, self.path)
            self.val_loss_min = val_loss
            self.counter = 0
        else:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(53)
    x = torch.randn(80, 5)
    y = x @ torch.randn(5, 1) + 0.3 * torch.randn(80, 1)
    train = DataLoader(TensorDataset(x[:60], y[:60]), batch_size=10, shuffle=True)
    val_x, val_y = x[60:], y[60:]
    model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    stopper = EarlyStopping(args.patience, os.path.join(args.out, "checkpoint.pt"))
    step = 0
    skipped = 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in train:
            try:
                loss = F.mse_loss(model(xb), yb)
                if not torch.isfinite(loss):
                    raise FloatingPointError("loss is not finite")
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            except FloatingPointError:
                skipped += 1
            finally:
                step += 1
            progress(step)
        model.eval()
        with torch.no_grad():
            val = F.mse_loss(model(val_x), val_y).item()
        stopper(val, model)
        if stopper.early_stop:
            break
    best = torch.load(stopper.path, weights_only=False)
    finish(model=model.state_dict(), best=best.state_dict(), epoch=epoch, steps=step, skipped=skipped,
           best_loss=stopper.val_loss_min)


if __name__ == "__main__":
    main()
