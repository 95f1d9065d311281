"""Pre-tokenized shards saved as tensors and memory-mapped back, as large-corpus scripts read
them: setup writes OUT/shards/*.pt once (kept when they exist), each epoch visits the shards in
an order `random.shuffle` draws, opens each with `torch.load(mmap=True)` (its storage a private
mapping of the file), and takes random windows from it with `torch.randint` for a few steps.
A tiny causal convolutional LM, Adam, a cosine schedule.
usage: mmap_shards.py OUT [--epochs N]"""
import argparse
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class ConvLM(nn.Module):
    def __init__(self, vocab=50, width=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.conv = nn.Conv1d(width, width, kernel_size=3)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        h = self.embed(tokens).transpose(1, 2)
        h = F.gelu(self.conv(F.pad(h, (2, 0))))
        return self.head(h.transpose(1, 2))


def write_shards(folder, count=4):
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(99)
    for i in range(count):
        path = os.path.join(folder, f"shard-{i}.pt")
        if not os.path.exists(path):
            torch.save(torch.randint(0, 50, (600,), generator=g, dtype=torch.int16), path)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    random.seed(8)
    torch.manual_seed(8)
    shards = write_shards(os.path.join(args.out, "shards"))
    model = ConvLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    steps_per_shard, context = 5, 24
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(shards) * steps_per_shard)
    step, losses = 0, []
    for epoch in range(args.epochs):
        order = list(shards)
        random.shuffle(order)
        for path in order:
            data = torch.load(path, mmap=True, weights_only=True)
            for _ in range(steps_per_shard):
                starts = torch.randint(0, len(data) - context - 1, (8,))
                window = torch.stack([data[s:s + context + 1] for s in starts.tolist()]).long()
                logits = model(window[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
                step += 1
                progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
