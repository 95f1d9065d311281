"""Tensors broadcast by expand() in setup, as sequence models keep them: position ids
`torch.arange(T).expand(B, T)` and a causal mask expanded over the batch, kept in the model;
a bias broadcast over the batch kept in a local and read every step.
usage: expanded_setup.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

B, T, D = 4, 6, 8


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, D)
        self.pos = nn.Embedding(T, D)
        self.head = nn.Linear(D, 10)
        self.position_ids = torch.arange(T).expand(B, T)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).expand(B, T, T)

    def forward(self, ids):
        h = self.emb(ids) + self.pos(self.position_ids)
        att = (h @ h.transpose(1, 2)).masked_fill(~self.mask, float("-inf")).softmax(-1)
        return self.head(att @ h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(2)
    model = Tiny()
    bias = torch.linspace(0, 0.1, D).expand(B, T, D)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, 10, (B, T))
        logits = model(ids) + bias.sum(-1, keepdim=True)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 10), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        progress(step)
    finish(model=model.state_dict())


if __name__ == "__main__":
    main()
