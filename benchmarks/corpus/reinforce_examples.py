"""REINFORCE (Monte-Carlo policy gradient) on a tiny balancing task simulated in numpy.

Modelled on: pytorch/examples reinforcement_learning/reinforce.py
(https://github.com/pytorch/examples/blob/main/reinforcement_learning/reinforce.py).
Habits reproduced: a two-layer policy with dropout that stays in training mode for the whole
run, saved_log_probs/rewards lists kept on the module, state.unsqueeze(0) per env step and
Categorical sampling, returns accumulated backwards into a deque with appendleft and
normalised with float32 eps, `torch.cat(policy_loss).sum()`, one Adam step per episode,
`del policy.rewards[:]` afterwards, running reward, and --render/--log-interval flags.
The gym environment is replaced by a numpy beam-balancing simulator with a gym-like API.
"""
import argparse
from collections import deque
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical


class BeamBalance:
    """A ball rolls on a beam whose tilt the agent nudges up or down; the episode ends when
    the ball falls off or the tilt saturates. Observations: ball position and velocity,
    beam tilt and tilt rate."""

    max_episode_steps = 40
    dt = 0.05

    def __init__(self):
        self.rng = np.random.default_rng()
        self.state = np.zeros(4)
        self.t = 0

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.state = self.rng.normal(0.0, 0.05, size=4)
        self.t = 0
        return self.state.astype(np.float32), {}

    def step(self, action):
        pos, vel, tilt, tilt_rate = self.state
        tilt_rate = 0.9 * tilt_rate + (0.6 if action == 1 else -0.6) * self.dt
        tilt = tilt + tilt_rate * self.dt
        acc = 5.0 * np.sin(tilt) + self.rng.normal(0.0, 0.2)
        vel = vel + acc * self.dt
        pos = pos + vel * self.dt
        self.state = np.array([pos, vel, tilt, tilt_rate])
        self.t += 1
        terminated = bool(abs(pos) > 1.0 or abs(tilt) > 0.5)
        truncated = self.t >= self.max_episode_steps
        return self.state.astype(np.float32), 1.0, terminated, truncated, {}

    def render(self):
        cells = [" "] * 21
        cells[int(np.clip((self.state[0] + 1.0) * 10, 0, 20))] = "o"
        print("|" + "".join(cells) + "|")


parser = argparse.ArgumentParser(description="PyTorch REINFORCE example (numpy beam balance)")
parser.add_argument("--gamma", type=float, default=0.99, metavar="G", help="discount factor (default: 0.99)")
parser.add_argument("--seed", type=int, default=543, metavar="N", help="random seed (default: 543)")
parser.add_argument("--steps", type=int, default=300, help="episodes to train (one optimizer step each)")
parser.add_argument("--render", action="store_true", help="render the environment")
parser.add_argument("--log-interval", type=int, default=4, metavar="N", help="interval between training status logs")
args = parser.parse_args()

env = BeamBalance()
env.reset(seed=args.seed)
torch.manual_seed(args.seed)


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


policy = Policy()
optimizer = optim.Adam(policy.parameters(), lr=1e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    R = 0
    policy_loss = []
    returns = deque()
    for r in policy.rewards[::-1]:
        R = r + args.gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for log_prob, R in zip(policy.saved_log_probs, returns):
        policy_loss.append(-log_prob * R)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]


def main():
    running_reward = 10
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for t in range(1, 10000):  # Don't infinite loop while learning
            action = select_action(state)
            state, reward, terminated, truncated, _ = env.step(action)
            if args.render:
                env.render()
            policy.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break

        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        finish_episode()
        if i_episode % args.log_interval == 0:
            print("Episode {}\tLast reward: {:.2f}\tAverage reward: {:.2f}".format(
                  i_episode, ep_reward, running_reward))
        if i_episode >= args.steps:
            print("Stopping after {} episodes; running reward {:.2f}, last episode {} steps".format(
                i_episode, running_reward, t))
            break


if __name__ == "__main__":
    main()
