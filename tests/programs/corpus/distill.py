"""Knowledge distillation in two phases, each a function with its own loop: a teacher trained
first, then a smaller student trained on the teacher's softened outputs (KL at temperature 4)
mixed with the hard labels. The student's hidden activations go through a straight-through
quantizer written as a torch.autograd.Function; the teacher answers in eval mode under
no_grad. A snapshot lands in either phase: a restart in the second must not train the teacher
again, and one in the first must go on to the second.
usage: distill.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class RoundSTE(torch.autograd.Function):
    """Rounds to a grid of 1/8 forwards, passes the gradient straight through backwards."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 8) / 8

    @staticmethod
    def backward(ctx, grad):
        return grad


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 12), nn.Linear(12, 5)

    def forward(self, x):
        return self.fc2(RoundSTE.apply(torch.tanh(self.fc1(x))))


def train_teacher(teacher, loader, epochs, step):
    optimizer = torch.optim.SGD(teacher.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(teacher(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    return step


def train_student(student, teacher, loader, epochs, step, temperature=4.0, alpha=0.7):
    optimizer = torch.optim.Adam(student.parameters(), lr=5e-3)
    teacher.eval()
    history = []
    for _ in range(epochs):
        for x, y in loader:
            with torch.no_grad():
                soft = F.softmax(teacher(x) / temperature, dim=1)
            logits = student(x + 0.05 * torch.randn_like(x))
            kd = F.kl_div(F.log_softmax(logits / temperature, dim=1), soft, reduction="batchmean") * temperature ** 2
            loss = alpha * kd + (1 - alpha) * F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(loss.item())
            step += 1
            progress(step)
    return step, history


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(31)
    x = torch.randn(160, 16)
    y = (x @ torch.randn(16, 5)).argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(32))

    teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 5))
    step = train_teacher(teacher, loader, args.epochs, 0)
    student = Student()
    step, history = train_student(student, teacher, loader, args.epochs, step)
    finish(teacher=teacher.state_dict(), student=student.state_dict(), history=history)


if __name__ == "__main__":
    main()
