"""A config dataclass main() defines; the initial one kept for the report, and the live one
replaced at epoch 2 by dataclasses.replace with a smaller learning rate and a new tag, which the
log and the optimizer read each step.
usage: local_config_replace.py OUT [--epochs N]"""
import argparse
import dataclasses
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

    @dataclasses.dataclass
    class Config:
        lr: float
        tag: str

    cfg = Config(lr=0.05, tag="warm")
    initial = cfg
    torch.manual_seed(5)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    step = 0
    with open(os.path.join(args.out, "train.log"), "w") as log:
        for epoch in range(args.epochs):
            if epoch == 2:
                cfg = dataclasses.replace(cfg, lr=0.01, tag="main")
            for _ in range(12):
                x = torch.randn(8, 4)
                loss = F.mse_loss(model(x), x[:, :1])
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                log.write(f"{step} {cfg.tag} {initial.tag} {initial.lr}\n")
                progress(step)
    finish(model=model.state_dict(), cfg=dataclasses.asdict(cfg), initial=dataclasses.asdict(initial))


if __name__ == "__main__":
    main()
