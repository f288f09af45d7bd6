"""DQN with a replay buffer, epsilon-greedy exploration and a periodically hard-copied
target network, on a small hand-written grid world.

Modelled on vwxyzjn/cleanrl ``cleanrl/dqn.py`` (single-file DQN: linear epsilon
schedule, ``learning_starts`` before any update, an update every
``train_frequency`` environment steps, TD target ``r + gamma * max_a Q_target(s', a) * (1 - done)``
from a frozen copy, MSE TD loss, Adam, and ``target_network.load_state_dict(q_network.state_dict())``
every ``target_network_frequency`` steps).  The environment replaces CartPole by
a 6x6 grid with walls where the agent must reach a goal corner.

Unusual about the loop: the data are produced by the policy being trained and
sampled from a ring buffer; the regression target moves in jumps whenever the
target network is re-copied, so the TD loss is not monotone; there is no epoch.
Progress is the mean episodic return (and the TD loss falls once exploration
has decayed).  4000 env steps, ~950 gradient steps.
"""
import random
from collections import deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SIZE = 6
WALLS = {(1, 1), (2, 1), (3, 3), (4, 3), (1, 4)}
GOAL = (SIZE - 1, SIZE - 1)
MOVES = [(0, 1), (1, 0), (0, -1), (-1, 0)]


class GridWorld:
    def __init__(self, seed, max_steps=40):
        self.rng = random.Random(seed)
        self.max_steps = max_steps

    def _obs(self):
        o = np.zeros(2 * SIZE, dtype=np.float32)
        o[self.pos[0]] = 1.0
        o[SIZE + self.pos[1]] = 1.0
        return o

    def reset(self):
        while True:
            self.pos = (self.rng.randrange(SIZE), self.rng.randrange(SIZE // 2))
            if self.pos not in WALLS:
                break
        self.t = 0
        return self._obs()

    def step(self, a):
        dx, dy = MOVES[a]
        nxt = (min(max(self.pos[0] + dx, 0), SIZE - 1), min(max(self.pos[1] + dy, 0), SIZE - 1))
        if nxt not in WALLS:
            self.pos = nxt
        self.t += 1
        done = self.pos == GOAL
        reward = 1.0 if done else -0.02
        truncated = self.t >= self.max_steps
        return self._obs(), reward, done, truncated


class ReplayBuffer:
    def __init__(self, capacity, seed):
        self.buf = deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def add(self, *transition):
        self.buf.append(transition)

    def sample(self, n):
        obs, act, rew, nxt, done = zip(*self.rng.sample(self.buf, n))
        return (torch.tensor(np.stack(obs)), torch.tensor(act), torch.tensor(rew, dtype=torch.float32),
                torch.tensor(np.stack(nxt)), torch.tensor(done, dtype=torch.float32))


class QNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * SIZE, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, len(MOVES)))

    def forward(self, x):
        return self.net(x)


def linear_schedule(start, end, duration, t):
    return max(end, start + (end - start) * t / duration)


def main():
    torch.set_num_threads(1)
    random.seed(0); np.random.seed(0); torch.manual_seed(0)
    total_steps, learning_starts, train_freq, target_freq = 4000, 200, 4, 100
    gamma, batch_size = 0.95, 64

    env = GridWorld(seed=1)
    q_network = QNetwork()
    target_network = QNetwork()
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)
    rb = ReplayBuffer(10000, seed=2)

    obs = env.reset()
    ep_return, returns, losses = 0.0, [], []
    for step in range(total_steps):
        eps = linear_schedule(1.0, 0.05, 0.5 * total_steps, step)
        if random.random() < eps:
            action = random.randrange(len(MOVES))
        else:
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs)).argmax())
        nxt, reward, done, truncated = env.step(action)
        rb.add(obs, action, reward, nxt, done)
        ep_return += reward
        obs = nxt
        if done or truncated:
            returns.append(ep_return)
            ep_return, obs = 0.0, env.reset()

        if step > learning_starts and step % train_freq == 0:
            b_obs, b_act, b_rew, b_nxt, b_done = rb.sample(batch_size)
            with torch.no_grad():
                target_max = target_network(b_nxt).max(dim=1).values
                td_target = b_rew + gamma * target_max * (1 - b_done)
            old_val = q_network(b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
            loss = F.mse_loss(old_val, td_target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

        if step % target_freq == 0:
            target_network.load_state_dict(q_network.state_dict())

        if (step + 1) % 800 == 0:
            recent = returns[-20:] if returns else [float("nan")]
            td = np.mean(losses[-50:]) if losses else float("nan")
            print(f"step {step + 1:5d} eps {eps:.2f} episodes {len(returns):4d} "
                  f"mean_return {np.mean(recent):+.3f} td_loss {td:.5f}")
    print(f"gradient steps: {len(losses)}")


if __name__ == "__main__":
    main()
