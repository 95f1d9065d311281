"""An Accelerate training loop: Accelerator(cpu=True) prepares a model, AdamW, a shuffled
DataLoader and an LR scheduler; epochs x batches with accelerator.backward. With --noisy, the
DataLoader's collate function adds noise to each batch from the global torch RNG (an
augmentation), which Accelerate's loader runs one batch ahead of the loop.
usage: accelerate_loop.py OUT [--epochs N] [--noisy]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
from accelerate import Accelerator
from common import finish, progress


def noisy_collate(samples):
    x, y = torch.utils.data.default_collate(samples)
    return x + 0.05 * torch.randn_like(x), y


def main():
    parser = argparse.ArgumentParser(description="a small regression model with Accelerate")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--noisy", action="store_true", help="a collate function that adds noise")
    args = parser.parse_args()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    X, Y = torch.randn(120, 12), torch.randn(120, 1)
    collate = noisy_collate if args.noisy else None
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True, collate_fn=collate)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.8)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses, step = [], 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            progress(step)
    model = accelerator.unwrap_model(model)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
