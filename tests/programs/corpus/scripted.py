"""A model compiled with TorchScript, as deployment-minded scripts train it: `torch.jit.script`
of a module with a scripted helper function and a buffer it updates in forward (a running mean
of its inputs), trained with RMSprop and a MultiStepLR; and the torch profiler around the loop
with a schedule (wait, warmup, active, repeat) that prof.step() advances, its traces handed to a
function that counts them. The loop runs inside torch.jit.optimized_execution(False) unless
--jit-optimize: TorchScript's executor optimizes a graph after its first calls in a process,
and the optimized graph computes other last bits. --profile-from N starts the profiler at step
N instead of before the loop, as scripts that profile a window of a long run do.
usage: scripted.py OUT [--steps N] [--no-profiler] [--jit-optimize] [--profile-from N]"""
import argparse
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from common import finish, progress


@torch.jit.script
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.fc2 = nn.Linear(32, 2)
        self.register_buffer("input_mean", torch.zeros(10))
        self.momentum = 0.1

    def forward(self, x):
        if self.training:
            self.input_mean.mul_(1 - self.momentum).add_(x.mean(0).detach() * self.momentum)
        return self.fc2(scaled_tanh(self.fc1(x - self.input_mean), 2.0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--no-profiler", action="store_true")
    parser.add_argument("--jit-optimize", action="store_true")
    parser.add_argument("--profile-from", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(101)
    model = torch.jit.script(Net())
    optimizer = torch.optim.RMSprop(model.parameters(), lr=3e-3, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 32], gamma=0.3)
    traces = []
    profiler = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=2, repeat=3),
                       on_trace_ready=lambda prof: traces.append(prof.step_num))
    losses = []
    if not args.no_profiler and not args.profile_from:
        profiler.start()
    with contextlib.nullcontext() if args.jit_optimize else torch.jit.optimized_execution(False):
        for step in range(args.steps):
            if not args.no_profiler and args.profile_from and step == args.profile_from:
                profiler.start()
            x = torch.randn(24, 10) + 0.5
            loss = F.cross_entropy(model(x), (x[:, 0] > 0.5).long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if not args.no_profiler and step >= args.profile_from:
                profiler.step()
            progress(step + 1)
    if not args.no_profiler:
        profiler.stop()

    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
           losses=losses, traces=traces)


if __name__ == "__main__":
    main()
