"""Data-parallel PPO on a vectorised CartPole with hand-rolled gradient all-reduce (2 gloo ranks).

Modelled on: vwxyzjn/cleanrl ``cleanrl/ppo_atari_multigpu.py`` (docs.cleanrl.dev,
"ppo_atari_multigpu.py"), with the classic-control MLP agent instead of the Atari CNN and a
CartPole-v1 written in numpy (same dynamics, termination and 500-step truncation as Gymnasium)
so that nothing has to be installed or downloaded.

Launch:  python -m torch.distributed.run --standalone --nproc-per-node 2 FILE.py

What is unusual about the loop (deliberate, as in the CleanRL script):
  * No DistributedDataParallel.  After ``loss.backward()`` the gradients of all parameters are
    flattened into one buffer, ``all_reduce(SUM)``-ed, divided by world size and copied back
    into ``param.grad`` before clipping and ``optimizer.step()``.
  * Seeding: ``torch.manual_seed(seed - local_rank)`` *before* building the agent (identical
    initial weights on every rank), then ``torch.manual_seed(seed)`` with ``seed += local_rank``
    afterwards, so action sampling, environment resets and minibatch shuffles differ per rank.
    Each rank therefore collects different rollouts, different advantages and different
    episode statistics; only the averaged gradient (and hence the weights) is shared.
  * The learning rate is annealed linearly to zero over the iterations by writing
    ``optimizer.param_groups[0]["lr"]`` directly.
"""
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

torch.set_num_threads(1)


@dataclass
class Args:
    seed: int = 1
    learning_rate: float = 2.5e-4 * 10
    local_num_envs: int = 4
    num_steps: int = 64
    num_iterations: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


class CartPoleVecEnv:
    """Numpy port of Gymnasium's CartPole-v1 with same-step autoreset and episode statistics."""

    def __init__(self, num_envs, seed):
        self.n = num_envs
        self.rng = np.random.default_rng(seed)
        self.gravity, self.masscart, self.masspole = 9.8, 1.0, 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self.theta_threshold = 12 * 2 * np.pi / 360
        self.x_threshold = 2.4
        self.max_steps = 500
        self.single_observation_shape = (4,)
        self.n_actions = 2

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=(self.n, 4))
        self.ep_len = np.zeros(self.n, dtype=np.int64)
        self.ep_ret = np.zeros(self.n)
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * theta_dot ** 2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta ** 2 / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1)
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        self.ep_len += 1
        self.ep_ret += 1.0
        truncated = self.ep_len >= self.max_steps
        reward = np.ones(self.n, dtype=np.float32)
        done = terminated | truncated
        finished = [(float(r), int(l)) for r, l in zip(self.ep_ret[done], self.ep_len[done])]
        if done.any():
            self.state[done] = self.rng.uniform(-0.05, 0.05, size=(int(done.sum()), 4))
            self.ep_len[done] = 0
            self.ep_ret[done] = 0.0
        return self.state.astype(np.float32), reward, terminated, truncated, finished


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


if __name__ == "__main__":
    args = Args()
    local_rank = int(os.getenv("LOCAL_RANK", "0"))
    world_size = int(os.getenv("WORLD_SIZE", "1"))
    local_batch_size = args.local_num_envs * args.num_steps
    local_minibatch_size = local_batch_size // args.num_minibatches
    num_envs = args.local_num_envs * world_size
    if world_size > 1:
        dist.init_process_group("gloo", rank=local_rank, world_size=world_size)

    # CRUCIAL: a different seed for each data-parallel worker, identical initial weights
    args.seed += local_rank
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed - local_rank)

    envs = CartPoleVecEnv(args.local_num_envs, seed=args.seed)
    agent = Agent(4, envs.n_actions)
    torch.manual_seed(args.seed)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.local_num_envs, 4))
    actions = torch.zeros((args.num_steps, args.local_num_envs))
    logprobs = torch.zeros((args.num_steps, args.local_num_envs))
    rewards = torch.zeros((args.num_steps, args.local_num_envs))
    dones = torch.zeros((args.num_steps, args.local_num_envs))
    values = torch.zeros((args.num_steps, args.local_num_envs))

    global_step, start_time, n_updates = 0, time.time(), 0
    next_obs = torch.Tensor(envs.reset())
    next_done = torch.zeros(args.local_num_envs)
    for iteration in range(1, args.num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        episode_returns = []
        for step in range(args.num_steps):
            global_step += num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            o, reward, term, trunc, finished = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward)
            next_obs, next_done = torch.Tensor(o), torch.Tensor(np.logical_or(term, trunc).astype(np.float32))
            episode_returns += [r for r, _ in finished]

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs, b_logprobs = obs.reshape(-1, 4), logprobs.reshape(-1)
        b_actions, b_advantages = actions.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)

        b_inds = np.arange(local_batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, local_batch_size, local_minibatch_size):
                mb_inds = b_inds[start:start + local_minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]
                mb_adv = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio,
                                    -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                if world_size > 1:
                    # batch the all-reduce: one flat buffer for every gradient
                    all_grads = torch.cat([p.grad.view(-1) for p in agent.parameters() if p.grad is not None])
                    dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)
                    offset = 0
                    for p in agent.parameters():
                        if p.grad is not None:
                            p.grad.data.copy_(all_grads[offset:offset + p.numel()].view_as(p.grad.data) / world_size)
                            offset += p.numel()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                n_updates += 1

        # rank-local episode statistics, averaged only for logging
        stats = torch.tensor([sum(episode_returns), float(len(episode_returns))])
        if world_size > 1:
            dist.all_reduce(stats)
        mean_ret = (stats[0] / stats[1]).item() if stats[1] > 0 else float("nan")
        if local_rank == 0:
            print(f"iter {iteration} global_step={global_step} lr={optimizer.param_groups[0]['lr']:.2e} "
                  f"loss={loss.item():.3f} v_loss={v_loss.item():.3f} approx_kl={approx_kl.item():.4f} "
                  f"clipfrac={np.mean(clipfracs):.3f} mean_episodic_return={mean_ret:.1f} "
                  f"local_episodes={len(episode_returns)} SPS={int(global_step / (time.time() - start_time))}", flush=True)
        print(f"local_rank: {local_rank}, iteration: {iteration}, actions.sum(): {int(actions.sum())}, "
              f"critic[-1].weight.sum(): {agent.critic[-1].weight.sum().item():.6f}", flush=True)

    if local_rank == 0:
        print(f"optimizer updates per rank: {n_updates}")
    if world_size > 1:
        dist.destroy_process_group()
