"""DQN target network turned into an alias of the online network at the first sync (accelerate).

Bug class: target network assigned by reference instead of copied, so after the
first hard update it *is* the online network and moves with every optimizer
step (the frozen target of DQN silently disappears).

Modelled on: andri27-ts/Reinforcement-Learning#14 "Updating target network -
Potential Bug" (after ``load_state_dict`` into the target, the code also
rebinds the target name to the moving network, so the target tracks the moving
network at every update).  The program is a DQN with replay buffer,
epsilon-greedy exploration, Huber TD loss and a hard target update every 10
optimizer steps, trained with ``accelerate`` (``Accelerator.prepare``,
``accelerator.backward``, ``accelerator.clip_grad_norm_``) on a small
chain-walk environment written in torch.

What goes wrong: ``sync_target()`` copies the weights correctly, then does
``target_net = accelerator.unwrap_model(q_net)``.  From then on the bootstrap
targets are computed from the very network being trained (only detached by
``no_grad``), every step, so the TD regression chases itself; later syncs do
nothing visible.  Returns still rise on this easy task, loss looks normal.

Healthy twin: the rebinding line is not executed (weights copied only).

Onset: the first sync runs after 10 optimizer steps; optimizer step K = 10 is
the first one that moves the target network's weights (70 steps in total, 60
affected).
"""
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)

N_STATES, MAX_LEN = 10, 30
GAMMA, BATCH, WARMUP, TOTAL_UPDATES, TARGET_EVERY = 0.95, 32, 64, 70, 10


class ChainWalk:
    """Walk left/right on a chain; +1 on reaching the right end, small step cost."""

    def __init__(self, gen):
        self.gen = gen

    def obs(self):
        o = torch.zeros(N_STATES + 1)
        o[self.pos] = 1.0
        o[-1] = self.pos / (N_STATES - 1)
        return o

    def reset(self):
        self.pos = int(torch.randint(0, 4, (1,), generator=self.gen))
        self.t = 0
        return self.obs()

    def step(self, action):
        slip = torch.rand(1, generator=self.gen).item() < 0.1
        move = (1 if action == 1 else -1) * (-1 if slip else 1)
        self.pos = min(max(self.pos + move, 0), N_STATES - 1)
        self.t += 1
        done = self.pos == N_STATES - 1
        reward = 1.0 if done else -0.01
        return self.obs(), reward, done or self.t >= MAX_LEN, done


class QNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_STATES + 1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)

    def forward(self, x):
        return self.head(self.body(x))


accelerator = Accelerator(cpu=True)
q_net = QNet()
target_net = QNet()
target_net.load_state_dict(q_net.state_dict())
target_net.requires_grad_(False)
optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
q_net, optimizer = accelerator.prepare(q_net, optimizer)

env = ChainWalk(torch.Generator().manual_seed(1))
buffer = []
n_updates, episode_ret, returns = 0, 0.0, []
obs = env.reset()
onset_printed = False


def sync_target():
    global target_net, onset_printed
    online = accelerator.unwrap_model(q_net)
    target_net.load_state_dict(online.state_dict())
    if not HEALTHY:
        target_net = online  # BUG: the target now *is* the online network
        if not onset_printed and accelerator.is_main_process:
            print(f"ONSET step {n_updates}")
            onset_printed = True


env_step = 0
while n_updates < TOTAL_UPDATES:
    eps = max(0.05, 1.0 - env_step / 150)
    if random.random() < eps:
        action = random.randint(0, 1)
    else:
        with torch.no_grad():
            action = int(q_net(obs[None]).argmax(1))
    nxt, r, finished, terminal = env.step(action)
    buffer.append((obs, action, r, nxt, float(terminal)))
    episode_ret += r
    obs = nxt
    env_step += 1
    if finished:
        returns.append(episode_ret)
        episode_ret = 0.0
        obs = env.reset()

    if len(buffer) < WARMUP:
        continue
    batch = random.sample(buffer, BATCH)
    s = torch.stack([b[0] for b in batch])
    a = torch.tensor([b[1] for b in batch])
    rew = torch.tensor([b[2] for b in batch])
    s2 = torch.stack([b[3] for b in batch])
    term = torch.tensor([b[4] for b in batch])

    q = q_net(s).gather(1, a[:, None]).squeeze(1)
    with torch.no_grad():
        target = rew + GAMMA * (1 - term) * target_net(s2).max(1).values
    loss = F.smooth_l1_loss(q, target)
    optimizer.zero_grad()
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(q_net.parameters(), 10.0)
    optimizer.step()
    n_updates += 1
    if n_updates % TARGET_EVERY == 0:
        sync_target()

recent = returns[-10:] if returns else [0.0]
accelerator.print(f"updates {n_updates} episodes {len(returns)} mean recent return {sum(recent) / len(recent):.3f}")
accelerator.print("done")
