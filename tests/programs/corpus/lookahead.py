"""Lookahead around RAdam ("Ranger"), written the way it is pasted into scripts: a plain class,
not an Optimizer, that keeps the base optimizer's param_groups (adding a counter to each), a
`defaultdict(dict)` of slow weights keyed by the parameters themselves, and every k steps pulls
the fast weights back toward the slow ones. Gradient centralization before each step, a cosine
schedule over the base optimizer, a shuffled DataLoader, accuracy kept per epoch.
usage: lookahead.py OUT [--epochs N]"""
import argparse
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class Lookahead:
    def __init__(self, optimizer, k=5, alpha=0.5):
        self.optimizer = optimizer
        self.k, self.alpha = k, alpha
        self.param_groups = optimizer.param_groups
        self.state = defaultdict(dict)
        for group in self.param_groups:
            group["counter"] = 0

    @torch.no_grad()
    def update(self, group):
        for fast in group["params"]:
            param_state = self.state[fast]
            if "slow_param" not in param_state:
                param_state["slow_param"] = fast.detach().clone()
            slow = param_state["slow_param"]
            slow += (fast - slow) * self.alpha
            fast.copy_(slow)

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        for group in self.param_groups:
            if group["counter"] == 0:
                self.update(group)
            group["counter"] += 1
            if group["counter"] >= self.k:
                group["counter"] = 0
        return loss

    def zero_grad(self):
        self.optimizer.zero_grad()


def centralize_gradients(model):
    for p in model.parameters():
        if p.grad is not None and p.grad.dim() > 1:
            p.grad -= p.grad.mean(dim=tuple(range(1, p.grad.dim())), keepdim=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(3)
    x = torch.randn(240, 12)
    y = (x[:, 0] * x[:, 1] > 0).long() + (x[:, 2] > 0.5).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.1), nn.Linear(48, 3))
    base = torch.optim.RAdam(model.parameters(), lr=3e-3)
    optimizer = Lookahead(base, k=6, alpha=0.5)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(base, T_max=args.epochs * len(loader))
    step, losses, accuracies = 0, [], []
    for epoch in range(args.epochs):
        model.train()
        correct = 0
        for xb, yb in loader:
            optimizer.zero_grad()
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            centralize_gradients(model)
            optimizer.step()
            schedule.step()
            correct += (logits.argmax(dim=1) == yb).sum().item()
            losses.append(loss.item())
            step += 1
            progress(step)
        accuracies.append(correct / len(loader.dataset))
    slow = [optimizer.state[p]["slow_param"] for p in model.parameters()]
    finish(model=model.state_dict(), base=base.state_dict(), slow=slow, losses=losses, accuracies=accuracies,
           counters=[g["counter"] for g in base.param_groups])


if __name__ == "__main__":
    main()
