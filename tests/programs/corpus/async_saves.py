"""Checkpoints saved in the background while training goes on, the way recent PyTorch scripts do:
every few steps the script waits on the previous save's future, then starts the next one, with
torch.distributed.checkpoint's async_save (one process, no process group) or by submitting a
torch.save of a copy of the state to a ThreadPoolExecutor made in setup (`--via pool`; with
`--save-s S` each such save takes S seconds more, so that a snapshot finds it still running).
usage: async_saves.py OUT [--via dcp|pool] [--steps N] [--every N] [--save-s S]"""
import argparse
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def save_slowly(state, path, seconds):
    time.sleep(seconds)
    torch.save(state, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--via", choices=("dcp", "pool"), default="dcp")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--save-s", type=float, default=0.0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")  # DCP in one process

    torch.manual_seed(91)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pool = ThreadPoolExecutor(max_workers=1)
    future, saved = None, []

    for step in range(1, args.steps + 1):
        x = torch.randn(32, 12)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long() + (x[:, 1] > 0).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0:
            if future is not None:
                saved.append(future.result() is None)
            path = os.path.join(args.out, f"checkpoint-{step}")
            if args.via == "dcp":
                future = dcp.async_save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=path)
            else:
                state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
                future = pool.submit(save_slowly, state, path + ".pt", args.save_s)
        progress(step)

    if future is not None:
        future.result()
    pool.shutdown()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), saved=saved)


if __name__ == "__main__":
    main()
