"""A2C on vectorised CartPole with a running observation normaliser that evaluation also updates.

Bug class: normalisation statistics (running mean/var buffers) updated by
evaluation data they should not see.

Modelled on: DLR-RM/rl-baselines3-zoo#275 "VecNormalize: training should be set to
False for eval environments" (normalisation stats updated by the evaluation env)
and Farama-Foundation/Gymnasium#256 "NormalizeX wrappers should not always update
their running statistics" (no way to freeze the running mean/std during
evaluation).  The program is a hand-written A2C in the style of
ikostrikov/pytorch-a2c-ppo-acktr-gail: 8 vectorised environments, 16-step
rollouts, shared actor-critic MLP, n-step returns, entropy bonus, gradient
clipping, observations whitened by a RunningMeanStd that is updated with every
rollout.  Every EVAL_EVERY updates a deterministic evaluation runs a few episodes
through the same normaliser.

What goes wrong: the evaluation calls the normaliser with its default
``update=True``, so long greedy evaluation episodes are folded into the running
mean/var (and the count).  From the first evaluation on, every observation the
policy is trained on is whitened with statistics contaminated by evaluation
rollouts, i.e. the network's inputs shift under it.  Nothing errors; returns and
losses look normal.

Healthy twin: evaluation normalises with ``update=False`` (frozen statistics).

Onset: the first evaluation runs after update index 9 (EVAL_EVERY = 10 updates,
0-based 0..9), so the first optimizer step that sees contaminated statistics is
K = 10.  Training runs 50 updates (40 buggy).
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N_ENVS, N_STEPS = 8, 16
UPDATES = 50
EVAL_EVERY = 10
EVAL_EPISODES, EVAL_MAX_LEN = 4, 200
GAMMA = 0.99


class CartPoleVec:
    """Batched classic cart-pole (same constants as the gym version), auto-reset."""

    def __init__(self, n, gen):
        self.n, self.gen = n, gen
        self.state = self._reset_states(n)
        self.length = torch.zeros(n)

    def _reset_states(self, k):
        return (torch.rand(k, 4, generator=self.gen) - 0.5) * 0.1

    def step(self, action):
        x, x_dot, th, th_dot = self.state.unbind(1)
        force = torch.where(action == 1, 10.0, -10.0)
        cos, sin = torch.cos(th), torch.sin(th)
        temp = (force + 0.05 * th_dot ** 2 * sin) / 1.1
        th_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos ** 2 / 1.1))
        x_acc = temp - 0.05 * th_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        th, th_dot = th + 0.02 * th_dot, th_dot + 0.02 * th_acc
        self.state = torch.stack([x, x_dot, th, th_dot], 1)
        self.length += 1
        done = (x.abs() > 2.4) | (th.abs() > 12 * 2 * math.pi / 360) | (self.length >= 500)
        reward = torch.ones(self.n)
        if done.any():
            self.state[done] = self._reset_states(int(done.sum()))
            self.length[done] = 0
        return self.state.clone(), reward, done


class RunningMeanStd:
    def __init__(self, shape, eps=1e-4):
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.var = torch.ones(shape, dtype=torch.float64)
        self.count = eps

    def update(self, x):
        x = x.double()
        b_mean, b_var, b_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = b_mean - self.mean
        tot = self.count + b_count
        self.mean = self.mean + delta * b_count / tot
        m2 = self.var * self.count + b_var * b_count + delta ** 2 * self.count * b_count / tot
        self.var = m2 / tot
        self.count = tot

    def normalize(self, x, update=True):
        if update:
            self.update(x)
        return ((x.double() - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10, 10).float()


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, 2)
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def evaluate(model, obs_rms, gen):
    env = CartPoleVec(1, gen)
    returns = []
    for _ in range(EVAL_EPISODES):
        obs, total = env.state.clone(), 0.0
        for _ in range(EVAL_MAX_LEN):
            # BUG (when not HEALTHY): default update=True folds eval observations into the stats
            norm = obs_rms.normalize(obs) if not HEALTHY else obs_rms.normalize(obs, update=False)
            with torch.no_grad():
                logits, _ = model(norm)
            obs, r, done = env.step(logits.argmax(-1))
            total += r.item()
            if done.item():
                break
        env.state, env.length = env._reset_states(1), torch.zeros(1)
        returns.append(total)
    return sum(returns) / len(returns)


def main():
    gen = torch.Generator().manual_seed(5)
    env = CartPoleVec(N_ENVS, gen)
    obs_rms = RunningMeanStd(4)
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, eps=1e-5)

    obs = obs_rms.normalize(env.state.clone())
    ep_ret, finished = torch.zeros(N_ENVS), []
    for update in range(UPDATES):
        if update == EVAL_EVERY and not HEALTHY:
            print(f"ONSET step {update}")
        obs_buf, act_buf, rew_buf, done_buf = [], [], [], []
        for _ in range(N_STEPS):
            with torch.no_grad():
                logits, _ = model(obs)
            action = torch.distributions.Categorical(logits=logits).sample()
            raw, reward, done = env.step(action)
            obs_buf.append(obs)
            act_buf.append(action)
            rew_buf.append(reward)
            done_buf.append(done.float())
            ep_ret += reward
            finished += ep_ret[done].tolist()
            ep_ret[done] = 0
            obs = obs_rms.normalize(raw)

        with torch.no_grad():
            _, next_v = model(obs)
        returns = torch.zeros(N_STEPS, N_ENVS)
        running = next_v
        for t in reversed(range(N_STEPS)):
            running = rew_buf[t] + GAMMA * running * (1 - done_buf[t])
            returns[t] = running

        b_obs = torch.stack(obs_buf).reshape(-1, 4)
        b_act = torch.stack(act_buf).reshape(-1)
        logits, values = model(b_obs)
        dist = torch.distributions.Categorical(logits=logits)
        adv = returns.reshape(-1) - values.detach()
        loss = (-(dist.log_prob(b_act) * adv).mean() + 0.5 * F.mse_loss(values, returns.reshape(-1))
                - 0.01 * dist.entropy().mean())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()

        if (update + 1) % EVAL_EVERY == 0:
            recent = finished[-20:]
            train_ret = sum(recent) / max(len(recent), 1)
            print(f"update {update + 1} train_return {train_ret:.1f} "
                  f"eval_return {evaluate(model, obs_rms, gen):.1f} obs_count {obs_rms.count:.0f}")
    print("done")


if __name__ == "__main__":
    main()
