"""Teacher, pseudo-labels, student, as self-training papers' scripts do: a teacher trained on
the labeled set with early stopping (its best weights kept by deepcopy and put back after the
loop), the unlabeled set labeled by it once (confident predictions only), then a student trained
on the labeled and pseudo-labeled sets together with input noise, through a DataLoader made
over a ConcatDataset (--workers N: with that many persistent workers; --last: the teacher's last
weights, no best kept).
usage: noisy_student.py OUT [--epochs N] [--workers N] [--last]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

from common import finish, progress


def make_model():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--last", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(41)
    w = torch.randn(12, 4)
    x_lab, x_unl, x_val = torch.randn(96, 12), torch.randn(160, 12), torch.randn(64, 12)
    y_lab, y_val = (x_lab @ w).argmax(1), (x_val @ w).argmax(1)
    labeled = DataLoader(TensorDataset(x_lab, y_lab), batch_size=16, shuffle=True)

    teacher = make_model()
    optimizer = torch.optim.Adam(teacher.parameters(), lr=4e-3)
    best, best_acc, step = None, -1.0, 0
    for epoch in range(args.epochs):
        for xb, yb in labeled:
            loss = F.cross_entropy(teacher(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        acc = evaluate(teacher, x_val, y_val)
        if acc > best_acc:
            best, best_acc = copy.deepcopy(teacher.state_dict()), acc
    if not args.last:
        teacher.load_state_dict(best)

    teacher.eval()
    with torch.no_grad():
        probs = F.softmax(teacher(x_unl), dim=1)
    confident = probs.max(1).values > 0.5
    pseudo = TensorDataset(x_unl[confident], probs.argmax(1)[confident])
    mixed = DataLoader(ConcatDataset([TensorDataset(x_lab, y_lab), pseudo]), batch_size=16, shuffle=True,
                       num_workers=args.workers, persistent_workers=args.workers > 0)

    student = make_model()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
    history = []
    for epoch in range(args.epochs):
        for xb, yb in mixed:
            loss = F.cross_entropy(student(xb + 0.1 * torch.randn_like(xb)), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        history.append(evaluate(student, x_val, y_val))
    finish(teacher=teacher.state_dict(), student=student.state_dict(), history=history, best_acc=best_acc,
           pseudo=int(confident.sum()))


if __name__ == "__main__":
    main()
