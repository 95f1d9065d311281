"""Changes to a model's structure made at a phase change, as fine-tuning scripts make them: from
--phase-epoch on, a new classifier head takes the old one's place and joins the optimizer as a
parameter group of its own while the old head's parameters stay in the first group (`replace`),
the same with a new optimizer over the whole model (`new_optimizer`), a buffer registered then
that keeps a running mean of the loss and scales it (`buffer`), or the output layer's weight
tied to the embedding's (`tie`).
usage: swap_head.py OUT MODE [--epochs N] [--phase-epoch N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


class TokenClassifier(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        hidden = torch.tanh(self.mix(self.embed(tokens).mean(1)))
        return self.head(hidden)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["replace", "new_optimizer", "buffer", "tie"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--phase-epoch", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(13)
    vocab, width = 20, 16
    tokens = torch.randint(0, vocab, (160, 6))
    targets = tokens[:, 0]
    loader = DataLoader(TensorDataset(tokens, targets), batch_size=16, shuffle=True)
    model = TokenClassifier(vocab, width)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.phase_epoch:
            if args.mode in ("replace", "new_optimizer"):
                model.head = nn.Linear(width, vocab)
                if args.mode == "replace":
                    optimizer.add_param_group({"params": model.head.parameters(), "lr": 0.02})
                else:
                    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
            elif args.mode == "buffer":
                model.register_buffer("loss_mean", torch.ones(()))
            else:
                model.head.weight = model.embed.weight
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            if hasattr(model, "loss_mean"):
                model.loss_mean.mul_(0.9).add_(0.1 * loss.detach())
                loss = loss / model.loss_mean
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
