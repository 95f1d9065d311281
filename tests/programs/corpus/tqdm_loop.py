"""A plain classification loop with tqdm progress bars over a shuffled DataLoader, in the two
ways people write it: `for batch in tqdm(loader)` (--variant for), or a bar kept in a variable
that gets set_postfix/set_description each step (--variant pbar).
usage: tqdm_loop.py OUT [--variant for|pbar] [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from common import finish, progress


def make_data(n, dim, classes, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g) * 0.6
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, dim, generator=g)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser(description="classifier with a tqdm progress bar")
    parser.add_argument("out")
    parser.add_argument("--variant", choices=["for", "pbar"], default="for")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_set = make_data(192, 20, 5, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    global_step = 0
    losses = []
    epoch_acc = []
    for epoch in range(args.epochs):
        model.train()
        correct = 0
        if args.variant == "for":
            for batch in tqdm(loader, desc=f"epoch {epoch}", leave=False):
                x, y = batch
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                correct += (logits.argmax(1) == y).sum().item()
                losses.append(loss.item())
                global_step += 1
                progress(global_step)
        else:
            pbar = tqdm(loader)
            for x, y in pbar:
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                correct += (logits.argmax(1) == y).sum().item()
                losses.append(loss.item())
                global_step += 1
                pbar.set_description(f"epoch {epoch}")
                pbar.set_postfix(loss=f"{loss.item():.4f}", step=global_step)
                progress(global_step)
            pbar.close()
        epoch_acc.append(correct / len(train_set))
        tqdm.write(f"epoch {epoch}: accuracy {epoch_acc[-1]:.3f}")

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, epoch_acc=epoch_acc,
           step=global_step)


if __name__ == "__main__":
    main()
