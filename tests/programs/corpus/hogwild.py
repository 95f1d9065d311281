"""Hogwild training as the PyTorch examples' mnist_hogwild lays it out: the model's parameters
in shared memory (`model.share_memory()`), N training processes started with
torch.multiprocessing, each running its own epochs of SGD on the shared weights, joined by the
main process, which then evaluates. usage: hogwild.py OUT [--processes N] [--epochs N]"""
import argparse
import os
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from common import finish, progress


def train(rank, model, epochs, pause_s):
    torch.manual_seed(100 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        for _ in range(8):
            x, y = torch.randn(16, 10), torch.randn(16, 1)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            time.sleep(pause_s)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(1)
    model = torch.nn.Linear(10, 1)
    model.share_memory()
    pause_s = float(os.environ.get("TEST_STEP_SLEEP_S", "0.01"))
    processes = []
    for rank in range(args.processes):
        p = mp.Process(target=train, args=(rank, model, args.epochs, pause_s))
        p.start()
        processes.append(p)
    for p in processes:
        while p.is_alive():  # the main process waits, a loop boundary at a time
            p.join(timeout=0.05)
            progress(1)
    progress(2)
    finish(model=model.state_dict())


if __name__ == "__main__":
    main()
