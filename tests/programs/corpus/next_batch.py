"""Step-count training whose loop takes its batches by hand, the ways people write it:
`next(iter(loader))` every step (--variant fresh: a new shuffled iterator per step), an
iterator kept in a variable and made again when it runs out (--variant reiter: `try: batch =
next(it) except StopIteration: it = iter(loader)`), or an endless generator over the loader,
`def cycle(dl): while True: for x in dl: yield x` (counting its passes), made once and advanced
with next() (--variant cycle). A cosine LR schedule with warmup, gradient clipping, an eval every --eval-every steps.
--own-generator: the loader's RandomSampler is made by the script with a generator of its own.
usage: next_batch.py OUT [--variant fresh|reiter|cycle] [--steps N] [--own-generator]"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from common import finish, progress


def cycle(dl):
    passes = 0
    while True:
        for data in dl:
            yield data
        passes += 1
        print(f"pass {passes} over the data done")


def cosine_with_warmup(optimizer, warmup, total):
    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        progress_ = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress_))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out')
    parser.add_argument('--variant', choices=['fresh', 'reiter', 'cycle'], default='fresh')
    parser.add_argument('--steps', type=int, default=80)
    parser.add_argument('--eval-every', type=int, default=20)
    parser.add_argument('--own-generator', action='store_true')
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(200, 10)
    y = (x[:, :3].sum(1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    if args.own_generator:
        sampler = RandomSampler(data, generator=torch.Generator().manual_seed(1))
        loader = DataLoader(data, batch_size=16, sampler=sampler, drop_last=True)
    else:
        loader = DataLoader(data, batch_size=16, shuffle=True, drop_last=True)
    val = (torch.randn(64, 10), None)
    val = (val[0], (val[0][:, :3].sum(1, keepdim=True) > 0).float())

    model = nn.Sequential(nn.Linear(10, 32), nn.SiLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = cosine_with_warmup(opt, warmup=8, total=args.steps)
    train_iter = cycle(loader) if args.variant == 'cycle' else iter(loader)

    losses, evals = [], []
    for step in range(args.steps):
        if args.variant == 'cycle':
            xb, yb = next(train_iter)
        elif args.variant == 'reiter':
            try:
                xb, yb = next(train_iter)
            except StopIteration:
                train_iter = iter(loader)
                xb, yb = next(train_iter)
        else:
            xb, yb = next(iter(loader))
        loss = F.binary_cross_entropy_with_logits(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                evals.append(F.binary_cross_entropy_with_logits(model(val[0]), val[1]).item())
            print(f"step {step + 1}: loss {losses[-1]:.4f} eval {evals[-1]:.4f} lr {sched.get_last_lr()[0]:.2e}")
        progress(step + 1)

    # cycle's own count of passes: the generator's locals, which a restart must give back too
    passes = train_iter.gi_frame.f_locals['passes'] if args.variant == 'cycle' else None
    finish(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(), losses=losses, evals=evals, passes=passes)


if __name__ == '__main__':
    main()
