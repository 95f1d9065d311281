"""Keeps the three best epochs' weights in a heap (validation loss, epoch, a copy of the state
dict) and ends with their uniform soup. The loss is smoothed over a deque of the last steps,
ReduceLROnPlateau lowers the rate when validation stalls, and the features come through an
lru_cache'd helper.
usage: topk_soup.py OUT [--epochs N]"""
import argparse
import collections
import copy
import functools
import heapq

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from common import finish, progress


@functools.lru_cache(maxsize=None)
def feature_weights(n: int) -> torch.Tensor:
    return torch.linspace(1.0, 0.5, n)


def evaluate(model, loader) -> float:
    model.eval()
    with torch.no_grad():
        total = sum(F.mse_loss(model(x * feature_weights(x.shape[1])), y, reduction="sum").item() for x, y in loader)
    model.train()
    return total / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=7)
    args = parser.parse_args()

    torch.manual_seed(13)
    x = torch.randn(400, 8)
    y = x[:, :3].prod(dim=1, keepdim=True) + 0.2 * torch.randn(400, 1)
    train_set, val_set = random_split(TensorDataset(x, y), [320, 80], generator=torch.Generator().manual_seed(1))
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=40)
    model = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)
    best, recent, smoothed, step = [], collections.deque(maxlen=5), [], 0
    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb * feature_weights(xb.shape[1])), yb)
            loss.backward()
            optimizer.step()
            recent.append(loss.item())
            smoothed.append(sum(recent) / len(recent))
            step += 1
            progress(step)
        val = evaluate(model, val_loader)
        plateau.step(val)
        heapq.heappush(best, (-val, epoch, copy.deepcopy(model.state_dict())))
        if len(best) > 3:
            heapq.heappop(best)
    soup = {k: sum(state[k] for _, _, state in best) / len(best) for k in best[0][2]}
    finish(soup=soup, kept=sorted(epoch for _, epoch, _ in best), smoothed=smoothed,
           optimizer=optimizer.state_dict(), lr=optimizer.param_groups[0]["lr"])


if __name__ == "__main__":
    main()
