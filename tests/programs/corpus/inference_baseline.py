"""A baseline evaluation before training under torch.inference_mode(), as recent tutorials write
evaluation: the baseline's predictions and loss are kept (inference tensors) to compare each
epoch's against; each epoch's evaluation also runs in inference mode and the best predictions so
far are kept. The log prints the improvement over the baseline.
usage: inference_baseline.py OUT [--epochs N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


@torch.inference_mode()
def evaluate(model, x, y):
    out = model(x)
    return out, F.mse_loss(out, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(12)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    vx, vy = torch.randn(32, 4), torch.randn(32, 1)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    baseline_preds, baseline_loss = evaluate(model, vx, vy)
    best_preds, best_loss = baseline_preds, baseline_loss
    log = open(os.path.join(args.out, "train.log"), "w")
    step = 0
    for epoch in range(args.epochs):
        for i in range(0, 64, 8):
            loss = F.mse_loss(model(x[i:i + 8]), y[i:i + 8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            progress(step)
        preds, val_loss = evaluate(model, vx, vy)
        if val_loss < best_loss:
            best_preds, best_loss = preds, val_loss
        log.write(f"epoch {epoch} val {val_loss.item():.6f} gain {(baseline_loss - val_loss).item():.6f} "
                  f"moved {(preds - baseline_preds).abs().mean().item():.6f}\n")
        log.flush()
    log.close()
    with open(os.path.join(args.out, "train.log")) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), best=best_preds.clone(), lines=lines)


if __name__ == "__main__":
    main()
