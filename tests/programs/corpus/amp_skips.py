"""Mixed precision on the CPU with float16 autocast and a GradScaler whose scale starts too high
and grows back every few steps: some steps overflow, and the scaler skips them (no optimizer
step in that iteration). Accumulation over two micro-batches, gradients unscaled and clipped.
usage: amp_skips.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(23)
    data = torch.randn(1024, 16)
    target = data @ torch.randn(16, 4) + 0.05 * torch.randn(1024, 4)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20, growth_interval=5)
    losses, scales, skipped = [], [], 0
    for step in range(args.steps):
        for micro in range(2):
            idx = torch.randint(0, len(data), (32,))
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(data[idx]), target[idx]) / 2
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.get_scale() < before
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        progress(step + 1)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
           losses=losses, scales=scales, skipped=skipped)


if __name__ == "__main__":
    main()
