"""SGD with Nesterov momentum under CyclicLR (which cycles the momentum too, and keeps its scale
function as a weak method of itself), chained with an ExponentialLR through ChainedScheduler; a
second parameter group for the biases without weight decay, and NAdam for an embedding trained
beside. Batches are sampled by hand with torch.randint from a Generator the script owns.
usage: cyclic_momentum.py OUT [--steps N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import ChainedScheduler, CyclicLR, ExponentialLR

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=90)
    args = parser.parse_args()

    torch.manual_seed(3)
    vocab, dim = 50, 12
    tokens = torch.randint(vocab, (600, 6))
    labels = (tokens.sum(1) % 3)
    embedding = nn.Embedding(vocab, dim)
    head = nn.Sequential(nn.Linear(dim, 32), nn.Tanh(), nn.Linear(32, 3))

    decay = [p for n, p in head.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in head.named_parameters() if n.endswith("bias")]
    sgd = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9, nesterov=True)
    nadam = torch.optim.NAdam(embedding.parameters(), lr=2e-3, decoupled_weight_decay=True, weight_decay=0.01)
    schedule = ChainedScheduler([
        CyclicLR(sgd, base_lr=0.005, max_lr=0.05, step_size_up=12, mode="triangular2", cycle_momentum=True),
        ExponentialLR(sgd, gamma=0.995),
    ])

    sampler = torch.Generator().manual_seed(77)
    history = []
    for step in range(args.steps):
        rows = torch.randint(len(tokens), (16,), generator=sampler)
        logits = head(embedding(tokens[rows]).mean(1))
        loss = F.cross_entropy(logits, labels[rows])
        sgd.zero_grad()
        nadam.zero_grad()
        loss.backward()
        sgd.step()
        nadam.step()
        schedule.step()
        history.append((loss.item(), sgd.param_groups[0]["lr"], sgd.param_groups[0]["momentum"]))
        progress(step + 1)
    finish(embedding=embedding.state_dict(), head=head.state_dict(), sgd=sgd.state_dict(), nadam=nadam.state_dict(),
           schedule=schedule.state_dict(), history=history)


if __name__ == "__main__":
    main()
