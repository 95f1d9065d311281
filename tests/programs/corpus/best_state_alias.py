"""Early stopping that keeps `best_state = model.state_dict()` without a copy, as many scripts
do: the state dict's tensors share the parameters' memory, so the "best" state follows the
model, and `model.load_state_dict(best_state)` at the end loads the last weights. Deterministic
all the same, and what the script computes. With --start-copied, the best starts as a deep copy
of the first weights and their validation loss. With --as-tuple, the best is one tuple,
`best = (val_loss, model.state_dict())`, None until the first validation. Validation each
epoch, Adam, a StepLR.
usage: best_state_alias.py OUT [--epochs N] [--start-copied] [--as-tuple]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        total = sum(F.cross_entropy(model(x), y, reduction="sum").item() for x, y in loader)
    model.train()
    return total / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--start-copied", action="store_true")
    parser.add_argument("--as-tuple", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(17)
    x = torch.randn(400, 12)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long()
    noisy = y[:160] ^ (torch.rand(160) < 0.3).long()  # few, noisy training labels: it overfits
    train = DataLoader(TensorDataset(x[:160], noisy), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[160:], y[160:]), batch_size=40)
    model = nn.Sequential(nn.Linear(12, 96), nn.ReLU(), nn.Dropout(0.1), nn.Linear(96, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)

    best_loss, best_state, history, step = float("inf"), None, [], 0
    if args.start_copied:
        best_loss, best_state = evaluate(model, val), copy.deepcopy(model.state_dict())
    best = None
    for epoch in range(args.epochs):
        for xb, yb in train:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        schedule.step()
        val_loss = evaluate(model, val)
        history.append(val_loss)
        if args.as_tuple and (best is None or val_loss < best[0]):
            best = (val_loss, model.state_dict())
        elif not args.as_tuple and val_loss < best_loss:
            best_loss, best_state = val_loss, model.state_dict()
    if args.as_tuple:
        best_loss, best_state = best
    model.load_state_dict(best_state)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history, best_loss=best_loss,
           best=best_state)


if __name__ == "__main__":
    main()
