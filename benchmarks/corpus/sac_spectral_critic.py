"""Soft actor-critic whose critics are spectrally normalised, on a toy 1-D reach task.

Modelled on: pranz24/pytorch-soft-actor-critic (sac.py, model.py: twin Q networks,
Gaussian policy with tanh squashing, soft target updates with ``target.data.copy_``,
entropy temperature) with the spectral-normalisation change of Bjorck et al. "Towards
Deeper Deep Reinforcement Learning with Spectral Normalization" (hidden layers of the
critic wrapped in ``nn.utils.spectral_norm``).  Habits reproduced: a replay buffer in
numpy, random exploration before learning starts, ``hard_update`` of the targets at
construction, ``soft_update`` after every step, ``critic_optim.zero_grad()`` /
``policy_optim.zero_grad()`` before each backward.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm


class QNetwork(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int = 32) -> None:
        super().__init__()
        self.q1 = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), spectral_norm(nn.Linear(hidden, hidden)),
                                nn.ReLU(), nn.Linear(hidden, 1))
        self.q2 = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), spectral_norm(nn.Linear(hidden, hidden)),
                                nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xu = torch.cat([state, action], 1)
        return self.q1(xu), self.q2(xu)


class GaussianPolicy(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU())
        self.mean = nn.Linear(hidden, act)
        self.log_std = nn.Linear(hidden, act)

    def sample(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(state)
        std = self.log_std(h).clamp(-5, 2).exp()
        normal = torch.distributions.Normal(self.mean(h), std)
        raw = normal.rsample()
        action = torch.tanh(raw)
        log_prob = (normal.log_prob(raw) - torch.log(1 - action.pow(2) + 1e-6)).sum(1, keepdim=True)
        return action, log_prob


def hard_update(target: nn.Module, source: nn.Module) -> None:
    target.load_state_dict(source.state_dict())


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    for t, s in zip(target.parameters(), source.parameters()):
        t.data.copy_(t.data * (1.0 - tau) + s.data * tau)


class Reach:
    """Move a point to the origin; reward is minus the distance."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.x = 0.0

    def reset(self) -> np.ndarray:
        self.x = float(self.rng.uniform(-1, 1))
        return np.array([self.x], dtype=np.float32)

    def step(self, action: float) -> tuple[np.ndarray, float]:
        self.x = float(np.clip(self.x + 0.2 * action, -2, 2))
        return np.array([self.x], dtype=np.float32), -abs(self.x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="gradient updates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--start-steps", type=int, default=64)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--tau", type=float, default=0.01)
    parser.add_argument("--alpha", type=float, default=0.2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    env = Reach(args.seed)
    critic, critic_target, policy = QNetwork(1, 1), QNetwork(1, 1), GaussianPolicy(1, 1)
    hard_update(critic_target, critic)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=3e-4)
    policy_optim = torch.optim.Adam(policy.parameters(), lr=3e-4)
    memory: list[tuple[np.ndarray, float, float, np.ndarray]] = []
    state = env.reset()
    for _ in range(args.start_steps):  # random exploration fills the buffer first
        action = float(env.rng.uniform(-1, 1))
        next_state, reward = env.step(action)
        memory.append((state, action, reward, next_state))
        state = next_state if abs(next_state[0]) > 0.05 else env.reset()

    for update in range(args.steps):
        with torch.no_grad():
            action, _ = policy.sample(torch.from_numpy(state).unsqueeze(0))
        next_state, reward = env.step(float(action.item()))
        memory.append((state, float(action.item()), reward, next_state))
        state = next_state if abs(next_state[0]) > 0.05 else env.reset()

        batch = [memory[i] for i in env.rng.integers(0, len(memory), args.batch_size)]
        s = torch.tensor(np.stack([b[0] for b in batch]))
        a = torch.tensor([[b[1]] for b in batch], dtype=torch.float32)
        r = torch.tensor([[b[2]] for b in batch], dtype=torch.float32)
        s2 = torch.tensor(np.stack([b[3] for b in batch]))
        with torch.no_grad():
            a2, log_p2 = policy.sample(s2)
            q1_t, q2_t = critic_target(s2, a2)
            target = r + args.gamma * (torch.min(q1_t, q2_t) - args.alpha * log_p2)
        q1, q2 = critic(s, a)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        critic_optim.zero_grad()
        critic_loss.backward()
        critic_optim.step()

        new_a, log_p = policy.sample(s)
        q1_pi, q2_pi = critic(s, new_a)
        policy_loss = (args.alpha * log_p - torch.min(q1_pi, q2_pi)).mean()
        policy_optim.zero_grad()
        policy_loss.backward()
        policy_optim.step()
        soft_update(critic_target, critic, args.tau)
        if update % 5 == 0:
            print(f"update {update} critic {critic_loss.item():.4f} policy {policy_loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
