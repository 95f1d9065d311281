"""Proximal policy optimisation as compact RL scripts write it: an outer loop over updates that
first collects a rollout of --steps environment steps (a cart-pole written here, with a numpy
RandomState of its own, reset when an episode ends), then computes returns and advantages by
GAE, then runs --epochs passes over shuffled minibatches (torch.randperm) of the rollout with a
clipped surrogate, a value loss and an entropy bonus. The optimizer steps in the minibatch loop;
a snapshot lands between two of them, with the rollout that the replay's skipped collection
would have made held in locals.
usage: ppo.py OUT [--updates N] [--steps T] [--epochs K]"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from common import finish, progress


class CartPole:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)
        self.state, self.t = None, 0

    def reset(self):
        self.state, self.t = self.rs.uniform(-0.05, 0.05, size=4), 0
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        temp = (force + 0.05 * theta_dot ** 2 * math.sin(theta)) / 1.1
        theta_acc = (9.8 * math.sin(theta) - math.cos(theta) * temp) / (0.5 * (4 / 3 - 0.1 * math.cos(theta) ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * math.cos(theta) / 1.1
        self.state = np.array([x + 0.02 * x_dot, x_dot + 0.02 * x_acc, theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc])
        self.t += 1
        done = abs(self.state[0]) > 2.4 or abs(self.state[2]) > 0.21 or self.t >= 200
        return self.state.astype(np.float32), 1.0, done


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 64), nn.Tanh())
        self.pi, self.v = nn.Linear(64, 2), nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return Categorical(logits=self.pi(h)), self.v(h).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--minibatch", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    env, agent = CartPole(seed=1), ActorCritic()
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    gamma, lam, clip = 0.99, 0.95, 0.2
    obs, episode_return, returns_seen, step = torch.from_numpy(env.reset()), 0.0, [], 0

    for update in range(args.updates):
        optimizer.param_groups[0]["lr"] = 2.5e-4 * (1 - update / args.updates)
        observations, actions, logprobs, rewards, dones, values = [], [], [], [], [], []
        with torch.no_grad():
            for t in range(args.steps):
                dist, value = agent(obs)
                action = dist.sample()
                next_obs, reward, done = env.step(action.item())
                observations.append(obs), actions.append(action), logprobs.append(dist.log_prob(action))
                rewards.append(reward), dones.append(done), values.append(value)
                episode_return += reward
                if done:
                    returns_seen.append(episode_return)
                    episode_return, next_obs = 0.0, env.reset()
                obs = torch.from_numpy(next_obs)
            _, next_value = agent(obs)
        advantages, last = torch.zeros(args.steps), 0.0
        for t in reversed(range(args.steps)):
            following = next_value if t == args.steps - 1 else values[t + 1]
            nonterminal = 1.0 - dones[t]
            delta = rewards[t] + gamma * following * nonterminal - values[t]
            last = delta + gamma * lam * nonterminal * last
            advantages[t] = last
        b_obs, b_actions, b_logprobs = torch.stack(observations), torch.stack(actions), torch.stack(logprobs)
        b_returns = advantages + torch.stack(values)

        for epoch in range(args.epochs):
            order = torch.randperm(args.steps)
            for start in range(0, args.steps, args.minibatch):
                mb = order[start:start + args.minibatch]
                dist, value = agent(b_obs[mb])
                ratio = (dist.log_prob(b_actions[mb]) - b_logprobs[mb]).exp()
                adv = advantages[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                loss = policy_loss + 0.5 * (value - b_returns[mb]).pow(2).mean() - 0.01 * dist.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
                step += 1
                progress(step)

    finish(agent=agent.state_dict(), optimizer=optimizer.state_dict(), returns=returns_seen, env=env.rs.get_state()[1].tolist(),
           obs=obs)


if __name__ == "__main__":
    main()
