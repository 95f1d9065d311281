"""The furniture of a typical training script around one step loop: a logging.FileHandler and a
csv.writer opened in setup, time.time() timers, an `itertools.count()` loop broken out of at
--steps, an EMA copy of the model (copy.deepcopy, lerp_), a GradScaler (disabled on CPU, still
in the state), a body and a head each with its own optimizer, a LambdaLR whose lambda is local.
usage: furniture.py OUT [--steps N]"""
import argparse
import copy
import csv
import itertools
import logging
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress

log = logging.getLogger("train")


class Net(nn.Module):
    def __init__(self, dim_in, width, classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim_in, width), nn.LayerNorm(width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(x))


def setup(args):
    os.makedirs(args.out, exist_ok=True)
    handler = logging.FileHandler(os.path.join(args.out, "train.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    metrics_file = open(os.path.join(args.out, "metrics.csv"), "w", newline="")
    metrics = csv.writer(metrics_file)
    metrics.writerow(["step", "loss", "lr_body", "lr_head", "elapsed_s"])
    log.info("setup done: %s", vars(args))
    return metrics_file, metrics


@torch.no_grad()
def update_ema(ema, model, decay):
    for ema_p, p in zip(ema.parameters(), model.parameters()):
        ema_p.lerp_(p, 1.0 - decay)
    for ema_b, b in zip(ema.buffers(), model.buffers()):
        ema_b.copy_(b)


def main():
    parser = argparse.ArgumentParser(description="training-script furniture")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--ema-decay", type=float, default=0.9)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    metrics_file, metrics = setup(args)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    teacher = torch.randn(24, 6, generator=data_gen)

    model = Net(24, 48, 6)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt_body = torch.optim.AdamW(model.body.parameters(), lr=2e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    warmup = lambda step: min(1.0, (step + 1) / args.warmup)  # noqa: E731
    sched_body = torch.optim.lr_scheduler.LambdaLR(opt_body, warmup)
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    losses = []
    t_start = time.time()
    t_last = time.time()
    for step in itertools.count():
        if step >= args.steps:
            break
        x = torch.randn(args.batch_size, 24, generator=data_gen)
        y = (x @ teacher).argmax(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            loss = F.cross_entropy(model(x), y)
        opt_body.zero_grad(set_to_none=True)
        opt_head.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt_body)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt_body)
        scaler.step(opt_head)
        scaler.update()
        sched_body.step()
        update_ema(ema, model, args.ema_decay)
        losses.append(loss.item())

        if step % args.log_every == 0:
            now = time.time()
            log.info("step %d loss %.4f (%.1f ms/step)", step, loss.item(), (now - t_last) * 1000 / args.log_every)
            metrics.writerow([step, f"{loss.item():.6f}", sched_body.get_last_lr()[0], opt_head.param_groups[0]["lr"], f"{now - t_start:.3f}"])
            metrics_file.flush()
            t_last = now
        progress(step + 1)

    log.info("done in %.1f s", time.time() - t_start)
    metrics_file.close()
    finish(model=model.state_dict(), ema=ema.state_dict(), opt_body=opt_body.state_dict(), opt_head=opt_head.state_dict(),
           sched_body=sched_body.state_dict(), scaler=scaler.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
