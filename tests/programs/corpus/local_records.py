"""Everything in main(), as many scripts keep it: a DQN-style replay memory of namedtuples and a
per-step record dataclass, both classes defined in main(); a phase Enum made there too, which
switches at step 30 and decides the learning rate; the best evaluation so far as another
namedtuple, replaced when it improves and read back at every step.
usage: local_records.py OUT [--steps N]"""
import argparse
import dataclasses
import enum
import json
import os
import random
from collections import deque, namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=70)
    args = parser.parse_args()
    Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))
    Best = namedtuple("Best", "loss step")

    @dataclasses.dataclass
    class Record:
        step: int
        loss: float
        phase: str
        best_step: int

    Phase = enum.Enum("Phase", "WARMUP TRAIN")
    random.seed(4)
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    memory = deque(maxlen=50)
    records = []
    phase = Phase.WARMUP
    best = Best(float("inf"), -1)
    probe = torch.randn(16, 4)
    state = torch.randn(4)
    for step in range(1, args.steps + 1):
        action = random.randrange(2)
        next_state = state * 0.9 + torch.randn(4) * 0.1
        memory.append(Transition(state, action, next_state, float(next_state.sum() > 0)))
        state = next_state
        if step == 30:
            phase = Phase.TRAIN
        if len(memory) >= 8:
            batch = Transition(*zip(*random.sample(memory, 8)))
            q = net(torch.stack(batch.state)).gather(1, torch.tensor(batch.action)[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(q, torch.tensor(batch.reward))
            for group in optimizer.param_groups:
                group["lr"] = 1e-3 if phase is Phase.WARMUP else 5e-3
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            records.append(Record(step, loss.item(), phase.name, best.step))
        if step % 10 == 0:
            with torch.no_grad():
                score = net(probe).pow(2).mean().item()
            if score < best.loss:
                best = Best(score, step)
        progress(step)
    with open(os.path.join(args.out, "records.jsonl"), "w") as f:
        for record in records:
            f.write(json.dumps(dataclasses.asdict(record)) + "\n")
    finish(model=net.state_dict(), phase=phase.name, best=tuple(best), memory=[t.action for t in memory],
           records=[dataclasses.astuple(record) for record in records])


if __name__ == "__main__":
    main()
