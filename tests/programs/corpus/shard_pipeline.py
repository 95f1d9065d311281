"""A streaming pipeline of chained generators, as webdataset-style scripts build one: the script
writes its samples once as JSON-lines shards, then an endless generator visits the shards in an
order a random.Random reshuffles each pass, reads each shard's lines, feeds them through a
shuffle buffer (the same Random), decodes, adds noise from a numpy Generator and batches. The
loop takes `itertools.islice` of the stream for a fixed budget of steps, with a warmup-then-
linear-decay LambdaLR and gradient clipping.
usage: shard_pipeline.py OUT [--steps N]"""
import argparse
import itertools
import json
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def write_shards(folder, shards=5, per_shard=24, seed=3):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(shards):
        with open(os.path.join(folder, f"shard-{s:03d}.jsonl"), "w") as f:
            for _ in range(per_shard):
                x = rng.normal(size=8).round(4).tolist()
                f.write(json.dumps({"x": x, "y": int(sum(x[:3]) > 0)}) + "\n")
    return sorted(os.path.join(folder, name) for name in os.listdir(folder))


def endless_shards(paths, rnd):
    while True:
        order = list(paths)
        rnd.shuffle(order)
        yield from order


def read_lines(paths):
    for path in paths:
        with open(path) as f:
            for line in f:
                yield json.loads(line)


def shuffle_buffer(samples, size, rnd):
    buffer = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= size:
            yield buffer.pop(rnd.randrange(len(buffer)))


def decode(samples, noise):
    for sample in samples:
        x = np.asarray(sample["x"], dtype=np.float32) + noise.normal(scale=0.05, size=8).astype(np.float32)
        yield torch.from_numpy(x), sample["y"]


def batched(samples, n):
    while True:
        chunk = list(itertools.islice(samples, n))
        if not chunk:
            return
        yield torch.stack([x for x, _ in chunk]), torch.tensor([y for _, y in chunk])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    paths = write_shards(os.path.join(args.out, "shards"))
    rnd, noise = random.Random(11), np.random.default_rng(12)
    stream = batched(decode(shuffle_buffer(read_lines(endless_shards(paths, rnd)), 16, rnd), noise), 8)

    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    warmup = 10
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.05, 1 - (s - warmup) / args.steps))
    losses = []
    for step, (x, y) in enumerate(itertools.islice(stream, args.steps), start=1):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(round(loss.item(), 6))
        progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, rnd=rnd.getstate(),
           noise=noise.bit_generator.state)


if __name__ == "__main__":
    main()
