"""More furniture, of the kind torch itself ships: stochastic weight averaging (AveragedModel with
an EMA function from get_ema_multi_avg_fn, SWALR after a SequentialLR warmup-then-cosine
schedule), a forward hook (a lambda) and a full backward hook (a closure) that collect
statistics into lists, weight_norm and spectral_norm parametrizations, a registered buffer the
model updates itself, activation checkpointing with dropout inside (it stashes and replays the
RNG state), and a python list of examples shuffled with random.shuffle at each epoch and sliced
into batches by hand.
usage: swa_hooks.py OUT [--epochs N]"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn
from torch.utils.checkpoint import checkpoint

from common import finish, progress


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = weight_norm(nn.Linear(dim, dim))
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return x + self.drop(F.gelu(self.fc(x)))


class Net(nn.Module):
    def __init__(self, dim_in, dim, classes):
        super().__init__()
        self.inp = spectral_norm(nn.Linear(dim_in, dim))
        self.blocks = nn.ModuleList([Block(dim) for _ in range(2)])
        self.out = nn.Linear(dim, classes)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.seen += x.shape[0]
        h = self.inp(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.training else block(h)
        return self.out(h)


def make_examples(n, seed):
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(10)]
        examples.append((x, int(x[0] * x[1] > 0) + 2 * int(x[2] > 0.5)))
    return examples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--swa-start", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20)
    args = parser.parse_args()

    random.seed(4)
    torch.manual_seed(4)
    train = make_examples(240, seed=5)
    model = Net(10, 32, 4)
    swa_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    steps_per_epoch = len(train) // args.batch_size
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=steps_per_epoch)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps_per_epoch * (args.swa_start - 1))
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[steps_per_epoch])
    swa_scheduler = SWALR(optimizer, swa_lr=0.01, anneal_epochs=1)

    activation_means = []
    grad_norms = []
    model.out.register_forward_hook(lambda module, inputs, output: activation_means.append(output.detach().mean().item()))

    def record_grad(module, grad_input, grad_output):
        grad_norms.append(grad_output[0].norm().item())

    model.inp.register_full_backward_hook(record_grad)

    losses = []
    step = 0
    for epoch in range(args.epochs):
        random.shuffle(train)
        model.train()
        for start in range(0, steps_per_epoch * args.batch_size, args.batch_size):
            batch = train[start:start + args.batch_size]
            x = torch.tensor([features for features, _ in batch])
            y = torch.tensor([label for _, label in batch])
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if epoch >= args.swa_start:
                swa_model.update_parameters(model)
            else:
                scheduler.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        if epoch >= args.swa_start:
            swa_scheduler.step()

    finish(model=model.state_dict(), swa=swa_model.state_dict(), optimizer=optimizer.state_dict(),
           scheduler=scheduler.state_dict(), swa_scheduler=swa_scheduler.state_dict(), losses=losses,
           activation_means=activation_means, grad_norms=grad_norms, order=train)


if __name__ == "__main__":
    main()
