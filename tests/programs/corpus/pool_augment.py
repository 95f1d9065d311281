"""Each epoch's augmentation computed in other processes (map over chunks of the examples, each
chunk's noise seeded by its epoch and start), then a shuffled pass over the augmented set: by a
multiprocessing.Pool made at start, or one made per epoch in a `with` (--per-epoch pool), or a
concurrent.futures.ProcessPoolExecutor made so (--per-epoch executor).
usage: pool_augment.py OUT [--epochs N] [--per-epoch pool|executor]"""
import argparse
import concurrent.futures
import multiprocessing

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

BASE = np.random.default_rng(0).standard_normal((96, 6)).astype(np.float32)


def augment(job):
    epoch, start = job
    rng = np.random.default_rng([epoch, start])
    chunk = BASE[start:start + 24]
    return chunk + 0.1 * rng.standard_normal(chunk.shape).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--per-epoch", choices=["pool", "executor"])
    args = parser.parse_args()
    torch.manual_seed(29)
    labels = torch.from_numpy((BASE[:, 0] > 0).astype(np.int64))
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pool = None if args.per_epoch else multiprocessing.Pool(2)
    step = 0
    for epoch in range(args.epochs):
        jobs = [(epoch, s) for s in range(0, 96, 24)]
        if args.per_epoch == "pool":
            with multiprocessing.Pool(2) as epoch_pool:
                parts = epoch_pool.map(augment, jobs)
        elif args.per_epoch == "executor":
            with concurrent.futures.ProcessPoolExecutor(2) as executor:
                parts = list(executor.map(augment, jobs))
        else:
            parts = pool.map(augment, jobs)
        x = torch.from_numpy(np.concatenate(parts))
        perm = torch.randperm(96)
        for i in range(0, 96, 16):
            idx = perm[i:i + 16]
            loss = F.cross_entropy(model(x[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
    if pool is not None:
        pool.close()
        pool.join()
    finish(model=model.state_dict())


if __name__ == "__main__":
    main()
