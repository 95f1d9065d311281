"""The hashing trick, as quick text-classification scripts write it: each token goes to bucket
`hash(token) % BUCKETS` of an EmbeddingBag (Python's own `hash()` of a str, which differs from one
process to the next unless PYTHONHASHSEED is set), and the per-label losses of a batch are summed
in the order of a `set` of labels, another order that follows the string hash. Synthetic
sentences from a seeded generator, AdamW, a linear warmup.
usage: hashed_features.py OUT [--steps N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

BUCKETS = 257
LABELS = ["sports", "politics", "science", "music", "travel"]
WORDS = ("game team vote law atom cell song band trip city score court senate gene star tour "
         "guitar flight ball policy lab beach").split()


class Bag(nn.Module):
    def __init__(self, dim=24):
        super().__init__()
        self.embed = nn.EmbeddingBag(BUCKETS, dim, mode="mean")
        self.head = nn.Linear(dim, len(LABELS))

    def forward(self, ids, offsets):
        return self.head(self.embed(ids, offsets))


def encode(sentences):
    ids, offsets = [], []
    for tokens in sentences:
        offsets.append(len(ids))
        ids += [hash(t) % BUCKETS for t in tokens]
    return torch.tensor(ids), torch.tensor(offsets)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(71)
    rng = random.Random(72)
    model = Bag()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    seen = set()

    for step in range(args.steps):
        labels = [rng.choice(LABELS) for _ in range(8)]
        sentences = [[rng.choice(WORDS) for _ in range(rng.randint(3, 9))] + [label[:3]] for label in labels]
        ids, offsets = encode(sentences)
        target = torch.tensor([LABELS.index(label) for label in labels])
        logits = model(ids, offsets)
        loss = torch.zeros(())
        for label in set(labels):  # per-label means, summed in the set's order
            mask = target == LABELS.index(label)
            loss = loss + F.cross_entropy(logits[mask], target[mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        seen.update(labels)
        progress(step + 1)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), seen=sorted(seen))


if __name__ == "__main__":
    main()
