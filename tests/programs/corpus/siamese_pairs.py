"""A siamese network on pairs a Dataset draws on the fly: `__getitem__` picks "same class or not"
with `random.randint` and the partner with `random.choice`, a shuffling DataLoader batches them,
a contrastive loss module keeps its margin, each epoch ends with a pair-accuracy check whose
line goes to a log opened for appending in setup, and the best weights are saved with
`torch.save` when the accuracy improves.
usage: siamese_pairs.py OUT [--epochs N]"""
import argparse
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import finish, progress


class PairDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y
        self.by_class = {}
        for i, label in enumerate(y.tolist()):
            self.by_class.setdefault(label, []).append(i)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        label = int(self.y[index])
        same = random.randint(0, 1)
        if same:
            other = random.choice(self.by_class[label])
        else:
            other_label = random.choice([c for c in self.by_class if c != label])
            other = random.choice(self.by_class[other_label])
        return self.x[index], self.x[other], torch.tensor(float(same))


class ContrastiveLoss(nn.Module):
    def __init__(self, margin=2.0):
        super().__init__()
        self.margin = margin

    def forward(self, a, b, same):
        d = F.pairwise_distance(a, b)
        return (same * d.pow(2) + (1 - same) * F.relu(self.margin - d).pow(2)).mean()


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 8))

    def forward(self, a, b):
        return self.net(a), self.net(b)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    random.seed(3)
    torch.manual_seed(3)
    centers = torch.randn(5, 16) * 1.5
    y = torch.randint(5, (160,))
    x = centers[y] + torch.randn(160, 16)
    loader = DataLoader(PairDataset(x, y), batch_size=16, shuffle=True)
    model, criterion = Tower(), ContrastiveLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    log = open(os.path.join(args.out, "train.log"), "a")
    best_acc, step = -1.0, 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        for a, b, same in loader:
            out_a, out_b = model(a, b)
            loss = criterion(out_a, out_b, same)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        scheduler.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for a, b, same in loader:
                out_a, out_b = model(a, b)
                correct += ((F.pairwise_distance(out_a, out_b) < criterion.margin / 2).float() == same).sum().item()
                total += len(same)
        acc = correct / total
        print(f"epoch {epoch} loss {loss.item():.4f} pair accuracy {acc:.3f}", file=log, flush=True)
        if acc > best_acc:
            best_acc = acc
            torch.save(model.state_dict(), os.path.join(args.out, "best.pt"))
    log.close()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), best=torch.load(os.path.join(args.out, "best.pt")),
           best_acc=best_acc)


if __name__ == "__main__":
    main()
