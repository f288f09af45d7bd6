"""DQN with a target network and replay buffer on a small hand-written corridor environment.

Modelled on CleanRL's single-file ``cleanrl/dqn.py`` (Huang et al., 2022;
Mnih et al., 2015): an MLP ``QNetwork``, a separate ``target_network``
initialised from it with ``load_state_dict`` and refreshed every
``target_network_frequency`` environment steps (``tau=1.0`` means a hard copy
via the soft-update formula, as in CleanRL), a linearly decaying epsilon-greedy
schedule, a uniform replay buffer, ``learning_starts`` warm-up, training every
``train_frequency`` steps with the TD target computed under ``torch.no_grad()``
and an MSE loss.

Gym is not available, so the environment is a 7-cell corridor with a gym-like
``reset``/``step`` API: start in the middle, actions left/right, reward +1 at the
right end, 0 at the left end, -0.05 per step, 20-step time limit.  600
environment steps with ``learning_starts=200`` and ``train_frequency=5`` give 79
optimizer steps.  The greedy policy is evaluated at the end.
"""
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--total-timesteps", type=int, default=600)
parser.add_argument("--learning-rate", type=float, default=1e-3)
parser.add_argument("--buffer-size", type=int, default=1000)
parser.add_argument("--gamma", type=float, default=0.9)
parser.add_argument("--tau", type=float, default=1.0)
parser.add_argument("--target-network-frequency", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--start-e", type=float, default=1.0)
parser.add_argument("--end-e", type=float, default=0.05)
parser.add_argument("--exploration-fraction", type=float, default=0.6)
parser.add_argument("--learning-starts", type=int, default=200)
parser.add_argument("--train-frequency", type=int, default=5)
args = parser.parse_args()

torch.set_num_threads(1)
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)


class CorridorEnv:
    """Gym-style corridor: cells 0..n-1, terminal at both ends."""

    def __init__(self, n=7, max_steps=20, seed=0):
        self.n, self.max_steps = n, max_steps
        self.rng = np.random.default_rng(seed)
        self.observation_dim, self.n_actions = n, 2

    def _obs(self):
        o = np.zeros(self.n, dtype=np.float32)
        o[self.pos] = 1.0
        return o

    def reset(self):
        self.pos, self.t = self.n // 2, 0
        return self._obs()

    def step(self, action):
        self.t += 1
        self.pos += 1 if action == 1 else -1
        reward, terminated = -0.05, False
        if self.pos == self.n - 1:
            reward, terminated = 1.0, True
        elif self.pos == 0:
            reward, terminated = 0.0, True
        truncated = self.t >= self.max_steps and not terminated
        return self._obs(), reward, terminated, truncated


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 64), nn.ReLU(),
            nn.Linear(64, 64), nn.ReLU(),
            nn.Linear(64, n_actions),
        )

    def forward(self, x):
        return self.network(x)


class ReplayBuffer:
    def __init__(self, size, obs_dim):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros(size, np.int64)
        self.rewards = np.zeros(size, np.float32)
        self.dones = np.zeros(size, np.float32)
        self.size, self.ptr, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, done):
        self.obs[self.ptr], self.next_obs[self.ptr] = obs, next_obs
        self.actions[self.ptr], self.rewards[self.ptr], self.dones[self.ptr] = action, reward, done
        self.ptr = (self.ptr + 1) % self.size
        self.full = self.full or self.ptr == 0

    def sample(self, batch_size):
        upper = self.size if self.full else self.ptr
        idx = np.random.randint(0, upper, size=batch_size)
        return (torch.from_numpy(self.obs[idx]), torch.from_numpy(self.actions[idx]),
                torch.from_numpy(self.next_obs[idx]), torch.from_numpy(self.rewards[idx]),
                torch.from_numpy(self.dones[idx]))


def linear_schedule(start_e, end_e, duration, t):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def evaluate(q_network, episodes=5):
    env = CorridorEnv(seed=123)
    returns = []
    for _ in range(episodes):
        obs, done, ret = env.reset(), False, 0.0
        while not done:
            with torch.no_grad():
                action = q_network(torch.from_numpy(obs)).argmax().item()
            obs, r, term, trunc = env.step(action)
            ret += r
            done = term or trunc
        returns.append(ret)
    return float(np.mean(returns))


env = CorridorEnv(seed=args.seed)
q_network = QNetwork(env.observation_dim, env.n_actions)
optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
target_network = QNetwork(env.observation_dim, env.n_actions)
target_network.load_state_dict(q_network.state_dict())
rb = ReplayBuffer(args.buffer_size, env.observation_dim)

print(f"greedy return before training: {evaluate(q_network):.3f}")
obs = env.reset()
episode_return, episode_returns, losses, n_updates = 0.0, [], [], 0
for global_step in range(args.total_timesteps):
    epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
    if random.random() < epsilon:
        action = random.randrange(env.n_actions)
    else:
        with torch.no_grad():
            action = q_network(torch.from_numpy(obs)).argmax().item()
    next_obs, reward, terminated, truncated = env.step(action)
    episode_return += reward
    # only true termination stops bootstrapping (truncation does not)
    rb.add(obs, next_obs, action, reward, float(terminated))
    obs = next_obs
    if terminated or truncated:
        episode_returns.append(episode_return)
        obs, episode_return = env.reset(), 0.0

    if global_step > args.learning_starts:
        if global_step % args.train_frequency == 0:
            b_obs, b_act, b_next, b_rew, b_done = rb.sample(args.batch_size)
            with torch.no_grad():
                target_max, _ = target_network(b_next).max(dim=1)
                td_target = b_rew + args.gamma * target_max * (1 - b_done)
            old_val = q_network(b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
            loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n_updates += 1
            losses.append(loss.item())
            if n_updates % 10 == 0:
                recent = np.mean(episode_returns[-5:]) if episode_returns else float("nan")
                print(f"step {global_step} update {n_updates} td_loss {np.mean(losses[-10:]):.4f} "
                      f"q_mean {old_val.mean().item():.3f} eps {epsilon:.2f} recent_return {recent:.3f}")

        # update target network
        if global_step % args.target_network_frequency == 0:
            for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)

print(f"optimizer steps: {n_updates}")
print(f"greedy return after training: {evaluate(q_network):.3f} (optimal 0.90)")
