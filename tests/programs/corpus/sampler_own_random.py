"""A batch sampler of the script's own that owns a `random.Random`: each epoch it shuffles the
indices within length buckets and the buckets' order with it, so each epoch's order depends on
where that generator stood. Variable-length sequences padded by a collate function, a GRU
classifier, Adam, a scheduler stepped each epoch.
usage: sampler_own_random.py OUT [--epochs N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Sampler

from common import finish, progress


class BucketSampler(Sampler):
    def __init__(self, lengths, batch_size: int, seed: int):
        self.lengths, self.batch_size = lengths, batch_size
        self.rng = random.Random(seed)

    def __iter__(self):
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        buckets = [order[i:i + 4 * self.batch_size] for i in range(0, len(order), 4 * self.batch_size)]
        batches = []
        for bucket in buckets:
            self.rng.shuffle(bucket)
            batches += [bucket[i:i + self.batch_size] for i in range(0, len(bucket), self.batch_size)]
        self.rng.shuffle(batches)
        return iter(batches)

    def __len__(self):
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size


def collate(samples):
    seqs = [s for s, _ in samples]
    return pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]), torch.tensor([y for _, y in samples])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(37)
    g = torch.Generator().manual_seed(37)
    lengths = torch.randint(3, 20, (192,), generator=g).tolist()
    data = [(torch.randint(1, 30, (n,), generator=g), int(n > 10)) for n in lengths]
    loader = DataLoader(data, batch_sampler=BucketSampler(lengths, 16, seed=37), collate_fn=collate)
    embed, rnn, head = nn.Embedding(30, 16, padding_idx=0), nn.GRU(16, 24, batch_first=True), nn.Linear(24, 2)
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    step, losses = 0, []
    for epoch in range(args.epochs):
        for tokens, lens, yb in loader:
            out, _ = rnn(embed(tokens))
            last = out[torch.arange(len(lens)), lens - 1]
            loss = F.cross_entropy(head(last), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        scheduler.step()
    finish(embed=embed.state_dict(), rnn=rnn.state_dict(), head=head.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
