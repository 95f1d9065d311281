"""Semi-supervised training in the FixMatch manner, reduced: a labeled and an unlabeled loader,
both shuffled, walked together with `zip`, epochs under `trange`, gradient accumulation over
`accum` batches (`if (i + 1) % accum == 0`), pseudo-labels from a weakly noised view kept above
a confidence threshold, a consistency loss on a strongly noised view, and an evaluation function
decorated with @torch.no_grad().
usage: semi_supervised.py OUT [--epochs N] [--accum K]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from tqdm import trange

from common import finish, progress


def blobs(n, seed, classes=3):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.nn.functional.one_hot(y, classes).float() * 2 + torch.randn(n, classes, generator=g)
    return x, y


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.8)
    args = parser.parse_args()

    torch.manual_seed(12)
    xl, yl = blobs(96, 1)
    xu, _ = blobs(384, 2)
    xt, yt = blobs(120, 3)
    labeled = DataLoader(TensorDataset(xl, yl), batch_size=8, shuffle=True)
    unlabeled = DataLoader(TensorDataset(xu), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, nesterov=True)

    history, accs, masks, i = [], [], [], 0
    for epoch in trange(args.epochs, desc="epochs", leave=False):
        for (x, y), (u,) in zip(labeled, unlabeled):
            weak = u + 0.05 * torch.randn_like(u)
            strong = u + 0.5 * torch.randn_like(u)
            with torch.no_grad():
                probs = F.softmax(model(weak), 1)
                confidence, pseudo = probs.max(1)
                mask = (confidence >= args.threshold).float()
            loss = F.cross_entropy(model(x), y) + (F.cross_entropy(model(strong), pseudo, reduction="none") * mask).mean()
            (loss / args.accum).backward()
            if (i + 1) % args.accum == 0:
                optimizer.step()
                optimizer.zero_grad()
            history.append(loss.item())
            masks.append(mask.mean().item())
            i += 1
            progress(i)
        accs.append(evaluate(model, xt, yt))

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history, accs=accs, masks=masks)


if __name__ == "__main__":
    main()
