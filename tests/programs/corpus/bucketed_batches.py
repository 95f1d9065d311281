"""Variable-length sequences batched by length, as NLP and speech scripts do: a Dataset of token
sequences of random lengths, a BatchSampler of its own (sorts indices into buckets of similar
length, shuffles within and across buckets with python's `random`, yields lists of indices)
passed as `batch_sampler=`, a collate_fn that pads each batch to its longest sequence, a second
DataLoader with a WeightedRandomSampler (its own torch.Generator) for an auxiliary
classification task whose batches are drawn by hand with next() and made again at its end, and
a GRU whose packed sequences go through an embedding.
usage: bucketed_batches.py OUT [--epochs N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset, WeightedRandomSampler

from common import finish, progress


class Sequences(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(1, vocab, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        seq = self.items[i]
        return seq[:-1], seq[1:]


class BucketBatchSampler(Sampler):
    def __init__(self, lengths, batch_size, bucket_size):
        self.lengths, self.batch_size, self.bucket_size = lengths, batch_size, bucket_size

    def __iter__(self):
        order = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], random.random()))
        buckets = [order[i:i + self.bucket_size] for i in range(0, len(order), self.bucket_size)]
        batches = []
        for bucket in buckets:
            random.shuffle(bucket)
            batches += [bucket[i:i + self.batch_size] for i in range(0, len(bucket), self.batch_size)]
        random.shuffle(batches)
        return iter(batches)

    def __len__(self):
        return sum(-(-min(self.bucket_size, len(self.lengths) - i) // self.batch_size)
                   for i in range(0, len(self.lengths), self.bucket_size))


def pad_batch(batch):
    inputs, targets = zip(*batch)
    lengths = torch.tensor([len(x) for x in inputs])
    return pad_sequence(inputs, batch_first=True), pad_sequence(targets, batch_first=True), lengths


class Tagger(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)
        self.aux = nn.Linear(4, 3)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.embed(x), lengths, batch_first=True, enforce_sorted=False)
        h, _ = self.rnn(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        return self.out(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    random.seed(71)
    torch.manual_seed(72)
    vocab = 40
    data = Sequences(96, vocab, seed=73)
    batches = BucketBatchSampler([len(x) for x, _ in (data[i] for i in range(len(data)))], batch_size=8, bucket_size=32)
    loader = DataLoader(data, batch_sampler=batches, collate_fn=pad_batch)
    aux_x = torch.randn(200, 4)
    aux_y = (aux_x[:, 0] > 0.5).long() + (aux_x[:, 1] > 0.5).long()
    weights = torch.tensor([1.0, 2.0, 4.0])[aux_y]
    aux_loader = DataLoader(TensorDataset(aux_x, aux_y), batch_size=10,
                            sampler=WeightedRandomSampler(weights, 200, generator=torch.Generator().manual_seed(74)))
    aux_iter = iter(aux_loader)
    model = Tagger(vocab, 24)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses, step = [], 0

    for epoch in range(args.epochs):
        for x, y, lengths in loader:
            try:
                ax, ay = next(aux_iter)
            except StopIteration:
                aux_iter = iter(aux_loader)
                ax, ay = next(aux_iter)
            logits = model(x, lengths)
            loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1), ignore_index=0)
            loss = loss + 0.1 * F.cross_entropy(model.aux(ax), ay)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, python_rng=random.getstate())


if __name__ == "__main__":
    main()
