"""State kept where scripts keep it without thinking of it as state: a class attribute that every
instance shares and the loop changes (the steps the model class has seen, which freeze its first
layer at step 30), an attribute set on a function (the number of times it has logged), and
mutable default arguments used as running statistics (the per-class loss averages a reweighting
helper keeps in its `stats={}`, every 7th call; the last losses a model method keeps in its
`recent=[]`, which set each epoch's learning rate), and a class defined inside main() that
counts the epochs done (the rate's decay). Each decides what later steps compute, past what a
restart's first iterations show.
usage: class_state.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Net(nn.Module):
    steps_seen = 0  # shared by every instance; the loop counts it up
    freeze_at = 30

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 24), nn.Linear(24, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))

    def smoothed(self, loss, recent=[]):  # noqa: B006 - the last losses live here
        recent.append(loss)
        del recent[:-5]
        return sum(recent) / len(recent)


def log_every(loss, every=5):
    log_every.calls = getattr(log_every, "calls", 0) + 1
    if log_every.calls % every == 0:
        print(f"call {log_every.calls}: loss {loss:.4f}")
    return log_every.calls


def class_weights(losses, labels, stats={}):  # noqa: B006 - the running statistic lives here
    for c in range(3):
        picked = losses[labels == c]
        if len(picked):
            stats[c] = 0.9 * stats.get(c, picked.mean().item()) + 0.1 * picked.mean().item()
    total = sum(stats.values())
    return torch.tensor([stats.get(c, 1.0) / total * 3 for c in range(3)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(21)
    x = torch.randn(160, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    class Schedule:  # defined where it is used; the epochs count up on the class
        epochs_done = 0

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    weights, calls, step = torch.ones(3), 0, 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            losses = F.cross_entropy(model(xb), yb, weight=weights, reduction="none")
            optimizer.zero_grad()
            losses.mean().backward()
            optimizer.step()
            Net.steps_seen += 1
            if Net.steps_seen == Net.freeze_at:
                model.fc1.requires_grad_(False)
            calls = log_every(losses.mean().item())
            if calls % 7 == 0:
                weights = class_weights(losses.detach(), yb)
            smoothed = model.smoothed(losses.mean().item())
            step += 1
            progress(step)
        Schedule.epochs_done += 1
        for group in optimizer.param_groups:  # each epoch's rate from the smoothed loss, decayed
            group["lr"] = (0.05 + 0.05 * min(smoothed, 1.0)) * 0.8 ** Schedule.epochs_done
    finish(model=model.state_dict(), weights=weights, calls=calls, seen=Net.steps_seen,
           stats=dict(class_weights.__defaults__[0]), recent=list(Net.smoothed.__defaults__[0]))


if __name__ == "__main__":
    main()
