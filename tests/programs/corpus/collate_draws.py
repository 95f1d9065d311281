"""A collate function that draws: each batch's tokens are masked at random (BERT-style, 15%) from
the global torch RNG while the DataLoader fetches it, in the main process (no workers, the
default) or in the workers (--workers N, --persistent to keep them from epoch to epoch). A small
embedding-bag classifier learns to predict the sequence's label through the masks.
usage: collate_draws.py OUT [--workers N] [--persistent] [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

MASK = 0


def mask_tokens(samples):
    tokens = torch.stack([tokens for tokens, _ in samples])
    labels = torch.tensor([label for _, label in samples])
    masked = torch.rand(tokens.shape) < 0.15
    return tokens.masked_fill(masked, MASK), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(11)
    tokens = torch.randint(1, 50, (160, 12))
    labels = (tokens[:, :3].sum(dim=1) > 75).long()
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=16, shuffle=True, collate_fn=mask_tokens,
                        num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0)
    model = nn.Sequential(nn.EmbeddingBag(50, 16), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step, losses = 0, []
    for epoch in range(args.epochs):
        for batch, target in loader:
            loss = F.cross_entropy(model(batch), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
