"""Gradient accumulation by a token budget, as sequence models are trained: batches of sequences
of random lengths, padded by the collate function, summed losses backpropagated per micro-batch,
and an optimizer step whenever the window has seen `--budget` tokens, the gradients first divided
by the window's token count and clipped. The window is data-dependent: its micro-batches vary.
A step for what is left of the window at each epoch's end. A GRU tagger, Adam, warmup by hand.
usage: token_budget.py OUT [--epochs N] [--budget TOKENS]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from common import finish, progress


def collate(samples):
    tokens = pad_sequence([s for s, _ in samples], batch_first=True)
    tags = pad_sequence([t for _, t in samples], batch_first=True, padding_value=-100)
    return tokens, tags


class Tagger(nn.Module):
    def __init__(self, vocab=40, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, 24, padding_idx=0)
        self.rnn = nn.GRU(24, 32, batch_first=True)
        self.out = nn.Linear(32, tags)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        return self.out(hidden)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=150)
    args = parser.parse_args()

    torch.manual_seed(5)
    samples = []
    for _ in range(160):
        n = int(torch.randint(3, 14, ()))
        tokens = torch.randint(1, 40, (n,))
        samples.append((tokens, tokens % 5))
    loader = DataLoader(samples, batch_size=8, shuffle=True, collate_fn=collate)
    model = Tagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    updates, step, window_tokens, losses, window_sizes, micro = 0, 0, 0, [], [], 0

    def update():
        nonlocal updates, window_tokens, micro
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= window_tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (updates + 1) / 10)
        optimizer.step()
        optimizer.zero_grad()
        window_sizes.append(micro)
        updates, window_tokens, micro = updates + 1, 0, 0

    for epoch in range(args.epochs):
        for tokens, tags in loader:
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten(), ignore_index=-100, reduction="sum")
            loss.backward()
            n_tokens = int((tags != -100).sum())
            window_tokens += n_tokens
            micro += 1
            losses.append(loss.item() / n_tokens)
            if window_tokens >= args.budget:
                update()
            step += 1
            progress(step)
        if window_tokens:
            update()
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, window_sizes=window_sizes)


if __name__ == "__main__":
    main()
