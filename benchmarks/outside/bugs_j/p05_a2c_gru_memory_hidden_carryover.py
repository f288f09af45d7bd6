"""Recurrent advantage actor-critic (A2C with GAE) on a cue-recall corridor task:
the agent sees a cue (left/right) at the first step of an episode, walks down a
corridor of random length, and is rewarded for turning to the cued side at the
junction.  The policy is a GRUCell actor-critic trained with truncated BPTT over
rollouts of 8 steps (baby-a3c's ``lstm_steps``).

Modelled on: greydanus/baby-a3c#10 "bugs when episode is done" -- in
baby-a3c the recurrent state is reset only at the *start of a rollout*
(``hx = zeros if done else hx.detach()``).  When an episode terminates in the
middle of a rollout, the environment is reset but the remaining steps of that
rollout run the new episode with the previous episode's hidden state, so the
cue of the old episode leaks into the new one and the gradient is computed on
those contaminated steps.  Training still "works" (reward goes up a bit, loss
is normal).  The fix suggested in the issue is to reset ``hx`` as soon as the
episode is done.

Unusual about the loop: single environment, no replay; value bootstrap is
masked at episode ends; entropy bonus; gradient clipping at 40 like baby-a3c;
RMSprop.  The onset is data-dependent (first episode that ends before the last
step of a rollout) and is detected at run time.
Run: python p05_a2c_gru_memory_hidden_carryover.py [--healthy]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class CueCorridor:
    """obs = [cue_left, cue_right, at_junction, progress, noise x4]"""

    def __init__(self, seed, min_len=40, max_len=64):
        self.g = torch.Generator().manual_seed(seed)
        self.min_len, self.max_len = min_len, max_len

    def _obs(self):
        o = torch.zeros(8)
        if self.t == 0:
            o[self.cue] = 1.0
        o[2] = float(self.t == self.length)
        o[3] = self.t / self.max_len
        o[4:] = 0.1 * torch.randn(4, generator=self.g)
        return o

    def reset(self):
        self.cue = int(torch.randint(0, 2, (1,), generator=self.g))
        self.length = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=self.g))
        self.t = 0
        return self._obs()

    def step(self, action):
        if self.t == self.length:  # junction: the turn decides the reward
            return self._obs(), (1.0 if action == self.cue else -1.0), True
        self.t += 1
        return self._obs(), -0.01, False


class GRUActorCritic(nn.Module):
    def __init__(self, obs_dim=8, hidden=64, n_actions=2):
        super().__init__()
        self.enc = nn.Linear(obs_dim, hidden)
        self.gru = nn.GRUCell(hidden, hidden)
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs, hx):
        hx = self.gru(F.elu(self.enc(obs)), hx)
        return self.pi(hx), self.v(hx).squeeze(-1), hx


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--lstm_steps", type=int, default=8)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--tau", type=float, default=0.95)
    args = parser.parse_args()

    torch.manual_seed(0)
    env = CueCorridor(seed=1)
    model = GRUActorCritic()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    act_gen = torch.Generator().manual_seed(2)

    obs = env.reset()
    hx = torch.zeros(1, 64)
    done = True
    onset_reported = False
    carried_norms, junction_hits = [], []
    for update in range(args.updates):
        hx = torch.zeros(1, 64) if done else hx.detach()  # baby-a3c style
        logps, values, rewards, masks, entropies = [], [], [], [], []
        stale_in_rollout = False
        for t in range(args.lstm_steps):
            logits, value, hx = model(obs.unsqueeze(0), hx)
            logp = F.log_softmax(logits, -1)
            action = int(torch.multinomial(logp.exp()[0], 1, generator=act_gen))
            next_obs, reward, done = env.step(action)
            logps.append(logp[0, action]); values.append(value[0])
            entropies.append(-(logp.exp() * logp).sum())
            rewards.append(reward); masks.append(0.0 if done else 1.0)
            if done:
                junction_hits.append(reward > 0)
                obs = env.reset()
                if t < args.lstm_steps - 1:
                    stale_in_rollout = True
                    carried_norms.append(0.0 if args.healthy else hx.detach().norm().item())
                if args.healthy:
                    hx = torch.zeros(1, 64)  # new episode, fresh memory
            else:
                obs = next_obs

        with torch.no_grad():
            next_value = model(obs.unsqueeze(0), hx)[1][0] * (0.0 if done else 1.0)
        # GAE over the rollout, masked at episode ends
        vals = torch.stack(values)
        v_next = torch.cat([vals[1:].detach(), next_value.view(1)])
        gae, advs = 0.0, []
        for t in reversed(range(args.lstm_steps)):
            delta = rewards[t] + args.gamma * v_next[t] * masks[t] - vals[t].detach()
            gae = delta + args.gamma * args.tau * masks[t] * gae
            advs.insert(0, gae)
        advs = torch.stack(advs)
        returns = advs + vals.detach()
        policy_loss = -(torch.stack(logps) * advs).sum()
        value_loss = 0.5 * (returns - vals).pow(2).sum()
        loss = policy_loss + 0.5 * value_loss - 0.01 * torch.stack(entropies).sum()

        if stale_in_rollout and not args.healthy and not onset_reported:
            print(f"ONSET step {update}")
            onset_reported = True
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 40)
        optimizer.step()
        if update % 10 == 0:
            print(f"update {update:3d} loss {loss.item():.4f} episodes {len(junction_hits)}")

    mean_carried = sum(carried_norms) / max(len(carried_norms), 1)
    print(f"EVIDENCE episodes started mid-rollout={len(carried_norms)} | mean |h| carried into "
          f"their first step={mean_carried:.3f} | junction success={sum(junction_hits)}/{len(junction_hits)}")


if __name__ == "__main__":
    main()
