"""A log of the steps into a file through the logging module; at a phase change (step 20) a
filter is added to the handler that keeps every fourth step's record, a lambda over a local of
main(). The log's lines are part of the final state. usage: log_filter.py OUT"""
import argparse
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    logger = logging.getLogger("train")
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(os.path.join(args.out, "train.log"))
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    torch.manual_seed(2)
    model = nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    every = 4
    for step in range(60):
        if step == 20:
            handler.addFilter(lambda record: record.step % every == 0)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logger.info("step %d loss %.6f", step, loss.item(), extra={"step": step})
        progress(step + 1)
    handler.close()
    with open(os.path.join(args.out, "train.log")) as f:
        lines = f.read().splitlines()
    finish(model=model.state_dict(), log=lines)


if __name__ == "__main__":
    main()
