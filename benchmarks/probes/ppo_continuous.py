"""Healthy probe: PPO for continuous actions in the style of CleanRL's ppo_continuous_action.py, with LayerNorm in the actor and critic trunks: rollouts of a Gaussian policy (state-independent actor_logstd parameter) collected under torch.no_grad() with the agent in train mode, GAE, several epochs of shuffled minibatch updates over the flattened buffer, per-minibatch advantage normalisation, clipped value loss, entropy bonus, clip_grad_norm_, and linear LR annealing written by hand into optimizer.param_groups[0]["lr"] each iteration.

The environment is a vectorised point mass that must be steered to the origin, written in
torch; ``--steps`` counts minibatch optimizer steps.
"""
import argparse
import math

import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal


class PointMass:
    def __init__(self, num_envs, gen, horizon=12):
        self.n, self.gen, self.horizon = num_envs, gen, horizon

    def reset(self):
        self.pos = torch.randn(self.n, 2, generator=self.gen)
        self.vel = torch.zeros(self.n, 2)
        self.t = torch.zeros(self.n, dtype=torch.long)
        return torch.cat([self.pos, self.vel], 1)

    def step(self, action):
        self.vel = 0.9 * self.vel + 0.1 * action.clamp(-1, 1)
        self.pos = self.pos + self.vel
        self.t += 1
        reward = -0.1 * self.pos.norm(dim=1)
        done = self.t >= self.horizon
        if done.any():       # auto-reset, as gym vector envs do
            self.pos[done] = torch.randn(int(done.sum()), 2, generator=self.gen)
            self.vel[done] = 0
            self.t[done] = 0
        return torch.cat([self.pos, self.vel], 1), reward, done.float()


def layer_init(layer, std=math.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim=4, act_dim=2, hidden=64):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.LayerNorm(hidden), nn.Tanh(),
                                    layer_init(nn.Linear(hidden, 1), std=1.0))
        self.actor_mean = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.LayerNorm(hidden), nn.Tanh(),
                                        layer_init(nn.Linear(hidden, act_dim), std=0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        mean = self.actor_mean(x)
        dist = Normal(mean, self.actor_logstd.expand_as(mean).exp())
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.critic(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8, help="minibatch optimizer steps")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=16)
    parser.add_argument("--update-epochs", type=int, default=2)
    parser.add_argument("--num-minibatches", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.0)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = math.ceil(args.steps / (args.update_epochs * args.num_minibatches))

    envs = PointMass(args.num_envs, gen)
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs = torch.zeros(args.num_steps, args.num_envs, 4)
    actions = torch.zeros(args.num_steps, args.num_envs, 2)
    logprobs, rewards, dones, values = (torch.zeros(args.num_steps, args.num_envs) for _ in range(4))
    next_obs, next_done = envs.reset(), torch.zeros(args.num_envs)

    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(args.num_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs, rewards[step], next_done = envs.step(action)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages, lastgaelam = torch.zeros_like(rewards), 0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs, b_actions = obs.reshape(-1, 4), actions.reshape(-1, 2)
        b_logprobs, b_adv = logprobs.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, generator=gen)
            for start in range(0, batch_size, minibatch_size):
                mb = b_inds[start:start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio,
                                    -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + (newvalue - b_values[mb]).clamp(-args.clip_coef, args.clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        print(f"iteration {iteration} lr {optimizer.param_groups[0]['lr']:.2e} pg {pg_loss.item():.4f} "
              f"v {v_loss.item():.4f} mean reward {rewards.mean().item():.4f}")

    agent.eval()
    with torch.no_grad():
        test_obs = PointMass(8, gen).reset()
        print(f"deterministic action norm {agent.actor_mean(test_obs).norm(dim=1).mean().item():.4f}")


if __name__ == "__main__":
    main()
