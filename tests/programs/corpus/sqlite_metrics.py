"""Metrics kept in an SQLite database, as small experiment trackers keep them: setup makes the
table, each epoch inserts its mean loss and accuracy and commits, and the end reads the rows and
their mean accuracy back by queries. `--wal` puts the database in write-ahead-log mode, where
commits stay in metrics.db-wal until a checkpoint; `--commit-at-end` commits once, at the end.
An MLP, SGD with momentum, a shuffled DataLoader.
usage: sqlite_metrics.py OUT [--epochs N] [--wal] [--commit-at-end]"""
import argparse
import os
import sqlite3

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--wal", action="store_true")
    parser.add_argument("--commit-at-end", action="store_true")
    args = parser.parse_args()

    db = sqlite3.connect(os.path.join(args.out, "metrics.db"))
    if args.wal:
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER, loss REAL, accuracy REAL)")
    db.commit()
    torch.manual_seed(12)
    x = torch.randn(192, 10)
    y = (x[:, :4].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(args.epochs):
        total, correct = 0.0, 0
        for xb, yb in loader:
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(yb)
            correct += (out.argmax(1) == yb).sum().item()
            step += 1
            progress(step)
        db.execute("INSERT INTO epochs VALUES (?, ?, ?)", (epoch, total / len(x), correct / len(x)))
        if not args.commit_at_end:
            db.commit()

    db.commit()
    rows = db.execute("SELECT epoch, loss, accuracy FROM epochs ORDER BY epoch").fetchall()
    mean_accuracy = db.execute("SELECT AVG(accuracy) FROM epochs").fetchone()[0]
    db.close()
    finish(model=model.state_dict(), rows=rows, mean_accuracy=mean_accuracy)


if __name__ == "__main__":
    main()
