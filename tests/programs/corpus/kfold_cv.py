"""K-fold cross-validation, as a competition notebook writes it: folds cut from a seeded
permutation, and inside the fold loop a fresh model, AdamW and a warm-restart cosine schedule
stepped by fractional epoch; a SubsetRandomSampler with a generator of its own per fold; early
stopping on the fold's validation loss, its best weights kept by deepcopy; at the end the folds'
best weights averaged into one model (a "soup"). Setup makes only the data: every model and
optimizer a snapshot holds was made inside a loop.
usage: kfold_cv.py OUT [--folds K] [--epochs N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, TensorDataset

from common import finish, progress


def make_model():
    return nn.Sequential(nn.Linear(12, 48), nn.GELU(), nn.Dropout(0.2), nn.Linear(48, 4))


@torch.no_grad()
def validate(model, loader):
    model.eval()
    losses = [F.cross_entropy(model(x), y, reduction="sum") for x, y in loader]
    model.train()
    return float(sum(losses) / len(loader.dataset))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(7)
    x = torch.randn(192, 12)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 0.5).long()) % 4
    dataset = TensorDataset(x, y)
    folds = torch.randperm(len(dataset)).chunk(args.folds)

    best_states, scores, step = [], [], 0
    for fold in range(args.folds):
        val_idx = folds[fold].tolist()
        train_idx = torch.cat([f for i, f in enumerate(folds) if i != fold]).tolist()
        sampler = SubsetRandomSampler(train_idx, generator=torch.Generator().manual_seed(100 + fold))
        train_loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        val_loader = DataLoader(Subset(dataset, val_idx), batch_size=32)

        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=2, T_mult=2)
        best, best_state, patience = float("inf"), None, 0
        for epoch in range(args.epochs):
            for i, (xb, yb) in enumerate(train_loader):
                loss = F.cross_entropy(model(xb), yb, label_smoothing=0.1)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step(epoch + (i + 1) / len(train_loader))
                step += 1
                progress(step)
            val_loss = validate(model, val_loader)
            if val_loss < best - 1e-4:
                best, best_state, patience = val_loss, copy.deepcopy(model.state_dict()), 0
            else:
                patience += 1
                if patience == 2:
                    break
        best_states.append(best_state)
        scores.append(best)

    soup = {k: sum(s[k] for s in best_states) / len(best_states) for k in best_states[0]}
    finish(soup=soup, scores=scores, last=model.state_dict(), optimizer=optimizer.state_dict(),
           scheduler=scheduler.state_dict())


if __name__ == "__main__":
    main()
