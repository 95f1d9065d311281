"""Training straight off a text file, as quick NLP scripts do: the script writes its corpus once,
then each epoch opens it and iterates its lines (`for line in f`), hashing words into a bag of
features; every few lines the legacy numpy global generator (`np.random.seed` at start) drops
words at random, and a running vocabulary (a Counter) grows as lines go by. A bigram model
trained with SGD and gradient clipping, a loss history per epoch in a dict of lists.
usage: line_stream.py OUT [--epochs N]"""
import argparse
import os
from collections import Counter, defaultdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

WORDS = "the a model learns from data and loss goes down slowly while gradients flow back through layers".split()


def write_corpus(path, lines, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(WORDS, size=rng.integers(4, 12))) + "\n")


def features(words, dim):
    x = torch.zeros(dim)
    for w in words:
        x[hash_word(w) % dim] += 1.0
    return x


def hash_word(word):
    return sum((i + 1) * ord(c) for i, c in enumerate(word))  # stable across processes, unlike hash()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    np.random.seed(61)
    torch.manual_seed(62)
    path = os.path.join(args.out, "corpus.txt")
    if not os.path.exists(path):
        write_corpus(path, 24, seed=63)
    dim = 64
    model = nn.Sequential(nn.Linear(dim, 48), nn.ReLU(), nn.Linear(48, len(WORDS)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    vocabulary, history, step = Counter(), defaultdict(list), 0

    for epoch in range(args.epochs):
        with open(path) as f:
            for line in f:
                words = line.split()
                if step % 3 == 0:
                    keep = np.random.rand(len(words)) > 0.2
                    words = [w for w, k in zip(words, keep) if k] or words[:1]
                vocabulary.update(words)
                x = torch.stack([features(words[:i], dim) for i in range(1, len(words))] or [features(words, dim)])
                y = torch.tensor([WORDS.index(w) for w in words[1:]] or [WORDS.index(words[0])])
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                history[epoch].append(loss.item())
                step += 1
                progress(step)

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), vocabulary=dict(vocabulary),
           history=dict(history), numpy_rng=np.random.get_state()[1].tolist())


if __name__ == "__main__":
    main()
