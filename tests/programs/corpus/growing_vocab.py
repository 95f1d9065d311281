"""A vocabulary built as the data streams in: tokens unseen so far get new ids, and when the
vocabulary outgrows the embedding, the script makes a larger embedding, copies the old rows in,
and makes the optimizer again over the new parameters (its moments start over). A bag-of-words
classifier over a stream of generated sentences, AdamW.
usage: growing_vocab.py OUT [--steps N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

WORDS = [f"w{i}" for i in range(120)]


def sentences(rng: random.Random):
    while True:
        k = rng.randint(3, 9)
        words = [WORDS[min(int(rng.expovariate(0.04)), len(WORDS) - 1)] for _ in range(k)]
        yield words, int(sum(int(w[1:]) for w in words) / k > 25)


class Classifier(nn.Module):
    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim)
        self.head = nn.Linear(dim, 2)

    def grow(self, vocab_size: int) -> None:
        old = self.embed
        self.embed = nn.EmbeddingBag(vocab_size, old.embedding_dim)
        with torch.no_grad():
            self.embed.weight[: old.num_embeddings] = old.weight

    def forward(self, ids, offsets):
        return self.head(self.embed(ids, offsets))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(43)
    rng = random.Random(43)
    stream = sentences(rng)
    vocab = {"<unk>": 0}
    model = Classifier(16, 12)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, sizes = [], []
    for step in range(args.steps):
        batch = [next(stream) for _ in range(8)]
        for words, _ in batch:
            for w in words:
                vocab.setdefault(w, len(vocab))
        if len(vocab) > model.embed.num_embeddings:
            model.grow(len(vocab) + 8)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            sizes.append((step, model.embed.num_embeddings))
        ids = torch.tensor([vocab[w] for words, _ in batch for w in words])
        offsets = torch.tensor([0] + [len(words) for words, _ in batch[:-1]]).cumsum(0)
        labels = torch.tensor([y for _, y in batch])
        loss = F.cross_entropy(model(ids, offsets), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        progress(step + 1)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), vocab=vocab, losses=losses, sizes=sizes)


if __name__ == "__main__":
    main()
