"""DQN with a replay buffer whose TD target bootstraps through terminal transitions.

Bug class: RL target construction -- episode termination (done mask) ignored in the
Bellman backup.

Modelled on: navneet-nmk/pytorch-rl #2 "'Done' not used in calculating Q-value
targets", seungeunrho/minimalRL #32 "Missing done mask?" (fixed in minimalRL PR #21
"ddpg minor bug: done_mask was not used when the target was calculated") and
cyoon1729/deep-Q-networks PR #5 "Fix perdqn's loss by adding done_mask".  The
transition tuple stores ``done`` but the target is computed as
``r + gamma * max_a Q_target(s', a)`` for every sample.

What goes wrong: as long as the sampled minibatches contain only non-terminal
transitions the update is exact; from the first minibatch that contains a terminal
transition on, the value of the goal/pit states is bootstrapped from the (meaningless)
Q-value of the terminal observation, so the learned values drift and the greedy policy
is trained on wrong targets.  Loss stays small and returns are plausible.

Healthy twin: multiplies the bootstrap term by ``(1 - done)``.

Onset: the first optimizer step whose sampled minibatch contains a transition with
done = 1 (the program detects it while sampling).  With these seeds the first episode
ends (in the pit or at the goal) at environment step 27; updates start once 16
transitions are stored (one update per environment step from t = 15 on, so the update
at t is step t - 15), so a terminal transition can first be sampled at step 12; it is
first drawn at K = 14 in this run (printed).  300 environment steps give 285 optimizer
steps.
"""
import random
import sys
from collections import deque

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)

GAMMA = 0.95
BATCH = 16
START_AFTER = 16
ENV_STEPS = 300
TARGET_SYNC = 25


class Corridor:
    """1-D corridor: pit at cell 0 (reward -1, terminal), goal at the last cell (+1, terminal)."""

    def __init__(self, length=14, start=5, max_steps=60):
        self.length, self.start, self.max_steps = length, start, max_steps

    def obs(self):
        o = torch.zeros(self.length + 1)
        o[self.pos] = 1.0
        o[-1] = self.pos / (self.length - 1)
        return o

    def reset(self):
        self.pos, self.t = self.start, 0
        return self.obs()

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        self.t += 1
        if self.pos <= 0:
            return self.obs(), -1.0, True, False
        if self.pos >= self.length - 1:
            return self.obs(), 1.0, True, False
        return self.obs(), -0.01, False, self.t >= self.max_steps


class QNet(nn.Module):
    def __init__(self, n_obs, n_act=2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_obs, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, n_act))

    def forward(self, x):
        return self.net(x)


def main():
    env = Corridor()
    q = QNet(env.length + 1)
    q_target = QNet(env.length + 1)
    q_target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-3)
    memory = deque(maxlen=5000)

    s = env.reset()
    step = 0
    onset_printed = False
    ep_return, returns = 0.0, []
    for t in range(ENV_STEPS):
        eps = max(0.05, 1.0 - t / 200)
        if random.random() < eps:
            a = random.randrange(2)
        else:
            with torch.no_grad():
                a = int(q(s).argmax())
        s2, r, done, truncated = env.step(a)
        memory.append((s, a, r, s2, float(done)))
        ep_return += r
        s = s2
        if done or truncated:
            returns.append(ep_return)
            ep_return = 0.0
            s = env.reset()

        if len(memory) >= START_AFTER:
            batch = random.sample(memory, BATCH)
            bs = torch.stack([b[0] for b in batch])
            ba = torch.tensor([b[1] for b in batch])
            br = torch.tensor([b[2] for b in batch])
            bs2 = torch.stack([b[3] for b in batch])
            bdone = torch.tensor([b[4] for b in batch])
            with torch.no_grad():
                next_q = q_target(bs2).max(1).values
                if HEALTHY:
                    target = br + GAMMA * next_q * (1.0 - bdone)
                else:
                    target = br + GAMMA * next_q  # BUG: done mask dropped
            if not HEALTHY and not onset_printed and bdone.sum() > 0:
                print(f"ONSET step {step}")
                onset_printed = True
            q_sa = q(bs).gather(1, ba[:, None]).squeeze(1)
            loss = F.smooth_l1_loss(q_sa, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % TARGET_SYNC == 0:
                q_target.load_state_dict(q.state_dict())

    with torch.no_grad():
        v_start = q(env.reset()).max().item()
    print(f"updates {step} episodes {len(returns)} mean_return_last5 "
          f"{sum(returns[-5:]) / max(1, len(returns[-5:])):.3f} V(start) {v_start:.3f}")
    print("done")


if __name__ == "__main__":
    main()
