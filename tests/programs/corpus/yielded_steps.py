"""A training loop written as a generator that yields each step's metrics, consumed by the
script's own `for step, (epoch, loss) in enumerate(...)`, which logs, and stops early at a step
budget; gradients clamped by tensor hooks on each parameter, and a forward pre-hook counting
the model's calls on an attribute of the module.
usage: yielded_steps.py OUT [--epochs N] [--budget STEPS]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def training_steps(model, optimizer, scheduler, loader, epochs):
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            yield epoch, loss.item()


def count_calls(module, inputs):
    module.calls += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--budget", type=int, default=70)
    args = parser.parse_args()

    torch.manual_seed(3)
    x = torch.randn(160, 8)
    y = (x[:, 0] * 2 + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Dropout(0.1), nn.Linear(24, 3))
    model.calls = 0
    model.register_forward_pre_hook(count_calls)
    for p in model.parameters():
        p.register_hook(lambda g: g.clamp(-0.5, 0.5))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=3e-3, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))

    history, running = [], 0.0
    for step, (epoch, loss) in enumerate(training_steps(model, optimizer, scheduler, loader, args.epochs)):
        history.append(loss)
        running = 0.9 * running + 0.1 * loss
        progress(step + 1)
        if step % 16 == 0:
            print(f"step {step} epoch {epoch} loss {running:.4f}", flush=True)
        if step + 1 >= args.budget:
            break
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
           history=history, running=running, calls=model.calls)


if __name__ == "__main__":
    main()
