"""A DQN agent as RL scripts write one: a toy grid environment stepped by a numpy Generator, an
epsilon-greedy policy that decays, a replay buffer of preallocated tensors (4 MiB of
observations, written in place one transition at a time as a ring), a target network kept by
Polyak averaging (torch._foreach_lerp_ over its parameters, outside any optimizer), episode
returns in a deque(maxlen=...), Huber loss and gradient clipping, and a loop over environment
steps whose training starts only once the buffer has warmed up.
usage: dqn_replay.py OUT [--steps N]"""
import argparse
import copy
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class GridWorld:
    """Walk to the goal on a noisy 2-D plane; the observation is a small embedding of the state."""

    def __init__(self, size, obs_dim, seed):
        self.size, self.obs_dim = size, obs_dim
        self.rng = np.random.default_rng(seed)
        self.basis = self.rng.standard_normal((2, obs_dim)).astype(np.float32)
        self.pos = np.zeros(2, dtype=np.int64)

    def observe(self):
        return torch.from_numpy((self.pos / self.size).astype(np.float32) @ self.basis)

    def reset(self):
        self.pos = self.rng.integers(0, self.size, size=2)
        return self.observe()

    def step(self, action):
        moves = ((0, 1), (1, 0), (0, -1), (-1, 0))
        slip = self.rng.random() < 0.1
        move = moves[self.rng.integers(4)] if slip else moves[action]
        self.pos = np.clip(self.pos + move, 0, self.size - 1)
        done = bool((self.pos == self.size - 1).all())
        return self.observe(), (1.0 if done else -0.01), done


class Replay:
    def __init__(self, capacity, obs_dim):
        self.obs = torch.zeros(capacity, obs_dim)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.action = torch.zeros(capacity, dtype=torch.long)
        self.reward = torch.zeros(capacity)
        self.done = torch.zeros(capacity, dtype=torch.bool)
        self.capacity, self.head, self.full = capacity, 0, False

    def add(self, obs, action, reward, next_obs, done):
        i = self.head
        self.obs[i], self.next_obs[i] = obs, next_obs
        self.action[i], self.reward[i], self.done[i] = action, reward, done
        self.head = (i + 1) % self.capacity
        self.full = self.full or self.head == 0

    def __len__(self):
        return self.capacity if self.full else self.head

    def sample(self, n, generator):
        idx = torch.randint(len(self), (n,), generator=generator)
        return self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.done[idx]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--warmup", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(21)
    obs_dim = 64
    env = GridWorld(size=6, obs_dim=obs_dim, seed=22)
    q_net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 4))
    target = copy.deepcopy(q_net).requires_grad_(False)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
    replay = Replay(capacity=8192, obs_dim=obs_dim)  # 2 x 2 MiB of observations
    explore = np.random.default_rng(23)
    batches = torch.Generator().manual_seed(24)
    returns, episode_return, losses = deque(maxlen=10), 0.0, []

    obs = env.reset()
    for step in range(1, args.steps + 1):
        epsilon = max(0.05, 1.0 - step / (0.6 * args.steps))
        if explore.random() < epsilon:
            action = int(explore.integers(4))
        else:
            with torch.no_grad():
                action = int(q_net(obs).argmax())
        next_obs, reward, done = env.step(action)
        replay.add(obs, action, reward, next_obs, done)
        episode_return += reward
        obs = next_obs
        if done:
            returns.append(episode_return)
            obs, episode_return = env.reset(), 0.0

        if len(replay) >= args.warmup:
            o, a, r, o2, d = replay.sample(32, batches)
            with torch.no_grad():
                best = target(o2).max(1).values
                goal = r + 0.97 * best * (~d)
            loss = F.smooth_l1_loss(q_net(o).gather(1, a[:, None]).squeeze(1), goal)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
            optimizer.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(target.parameters()), list(q_net.parameters()), 0.05)
            losses.append(loss.item())
        progress(step)

    finish(q_net=q_net.state_dict(), target=target.state_dict(), optimizer=optimizer.state_dict(),
           replay=vars(replay), returns=list(returns), losses=losses, env_rng=env.rng.bit_generator.state,
           explore=explore.bit_generator.state, batches=batches.get_state(), pos=env.pos.tolist())


if __name__ == "__main__":
    main()
