"""Pretraining, then fine-tuning at a lower learning rate from epoch 2: each step's loss is
recorded through `record`, a list's bound `append`, which moves from the pretraining list to the
fine-tuning one at the switch, and logged through `write`, a log file's bound `write`, which
moves to a second log opened at the switch. The history and the logs are part of the final state.
usage: phase_history.py OUT [--epochs N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(2)
    model = nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    history = {"pretrain": [], "finetune": []}
    record = history["pretrain"].append
    log = open(os.path.join(args.out, "pretrain.log"), "w")
    write = log.write
    X, Y = torch.randn(120, 6), torch.randn(120, 1)
    step = 0
    for epoch in range(args.epochs):
        if epoch == 2:
            record = history["finetune"].append
            log.close()
            log = open(os.path.join(args.out, "finetune.log"), "w")
            write = log.write
            for group in opt.param_groups:
                group["lr"] = 0.01
        for i in range(0, 120, 12):
            loss = F.mse_loss(model(X[i:i + 12]), Y[i:i + 12])
            opt.zero_grad()
            loss.backward()
            opt.step()
            record(round(loss.item(), 6))
            write(f"{epoch} {step} {loss.item():.6f}\n")
            log.flush()
            step += 1
            progress(step)
    log.close()
    logs = {}
    for name in ("pretrain.log", "finetune.log"):
        with open(os.path.join(args.out, name)) as f:
            logs[name] = f.read()
    finish(model=model.state_dict(), history=history, logs=logs)


if __name__ == "__main__":
    main()
