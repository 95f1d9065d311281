"""Steps counted per phase in a dict keyed by the members of an Enum main() defines, and the
losses of each phase in a defaultdict keyed the same way; the phase moves on every 20 steps.
usage: local_enum_keys.py OUT [--steps N]"""
import argparse
import enum
from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()

    class Phase(enum.Enum):
        WARMUP = "warmup"
        MAIN = "main"
        COOL = "cool"

    torch.manual_seed(1)
    model = nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counts = {phase: 0 for phase in Phase}
    losses = defaultdict(list)
    scale = {Phase.WARMUP: 0.5, Phase.MAIN: 1.0, Phase.COOL: 0.25}
    phase = Phase.WARMUP
    for step in range(1, args.steps + 1):
        if step % 20 == 0:
            phase = list(Phase)[min(step // 20, 2)]
        x = torch.randn(8, 6)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        (loss * scale[phase]).backward()
        optimizer.step()
        counts[phase] += 1
        losses[phase].append(round(loss.item(), 6))
        progress(step)
    finish(model=model.state_dict(), counts={p.value: n for p, n in counts.items()},
           losses={p.value: v for p, v in losses.items()}, phase=phase.value)


if __name__ == "__main__":
    main()
