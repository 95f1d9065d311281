"""An off-policy learner whose replay memory is allocated at the first transition, when the
observation's size is known, as RL scripts do: a NumPy array the transitions are written into,
and a tensor over the same memory (`torch.from_numpy`) that minibatches are drawn from. Both are
None until then. With --memory-first the array is allocated before the loop (its size given) and
only the tensor is made at the first transition. A toy environment; a Q-network regresses on the
drawn batches.
usage: lazy_buffer.py OUT [--steps N] [--capacity N] [--memory-first]"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def observe(rng, step):
    return np.concatenate([rng.standard_normal(5), [np.sin(step / 7.0)]]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--capacity", type=int, default=48)
    parser.add_argument("--memory-first", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    q = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(q.parameters(), lr=3e-3)
    memory = memory_t = None
    if args.memory_first:
        memory = np.zeros((args.capacity, 7), dtype=np.float32)
    filled, losses = 0, []
    for step in range(args.steps):
        obs = observe(rng, step)
        if memory_t is None:
            if memory is None:
                memory = np.zeros((args.capacity, obs.size + 1), dtype=np.float32)
            memory_t = torch.from_numpy(memory)
        memory[step % args.capacity, :-1] = obs
        memory[step % args.capacity, -1] = obs[:3].sum() * 0.5
        filled = min(filled + 1, args.capacity)
        index = torch.randint(0, filled, (8,))
        batch = memory_t[index]
        loss = F.mse_loss(q(batch[:, :-1]).squeeze(1), batch[:, -1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        progress(step + 1)
    finish(q=q.state_dict(), optimizer=optimizer.state_dict(), memory=memory_t.clone(), losses=losses)


if __name__ == "__main__":
    main()
