"""Progressive Neural Networks for continual RL (Rusu et al., 2016): one column per task, lateral
connections from frozen earlier columns, actor-critic (REINFORCE with a learned baseline) on two
corridor tasks.

Modelled on: pytorch/pytorch#59925 "Implicit module registration permits silent programming errors in
torch.nn.Module" (https://github.com/pytorch/pytorch/issues/59925): sub-modules kept in a plain Python
``list`` are not registered, so "optimizers may silently fail to update parameters of those modules".
Same report in pytorch/pytorch#38639 ("as soon as you add any module to a python list the parameters of
that module get invisible and hence can't be seen by the optimizer") and the older #666 / #715.
The fix is ``nn.ModuleList``.  ``--healthy`` stores the added columns in an ``nn.ModuleList``.

Unusual about the loop: the network grows during training.  The first column is a plain attribute and
trains on task A (steps 0-11).  At the task switch ``add_column()`` freezes everything learned so far,
appends a new column with lateral adapters plus new policy/value heads, and the optimizer is rebuilt
from ``filter(requires_grad, model.parameters())``.  The heads live in an ``nn.ModuleList``.  The extra
columns go into ``self.new_columns = []``, so for task B the optimizer only sees the new heads, while
the forward pass still runs through the unregistered, never-updated column.  Nothing fails: the
optimizer is not empty and the return still rises a little.
"""
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
np.random.seed(0)

N_POS, START, MAX_T, N_ENVS = 9, 4, 12, 48


class Corridor:
    """Vectorised 1-D corridor.  Task A pays at the right end, task B at the left end; the last
    observation bit says whether the agent has been near the right end (used by task A's shaping)."""

    def __init__(self, task):
        self.task = task

    def reset(self):
        self.pos = np.full(N_ENVS, START)
        self.visited_right = np.zeros(N_ENVS, dtype=bool)
        self.done = np.zeros(N_ENVS, dtype=bool)
        return self.obs()

    def obs(self):
        o = np.zeros((N_ENVS, N_POS + 1), dtype=np.float32)
        o[np.arange(N_ENVS), self.pos] = 1.0
        o[:, -1] = self.visited_right
        return torch.from_numpy(o)

    def step(self, action):
        move = np.where(action == 1, 1, -1)
        self.pos = np.clip(self.pos + np.where(self.done, 0, move), 0, N_POS - 1)
        self.visited_right |= self.pos >= N_POS - 2
        reward = np.where(self.done, 0.0, -0.02)
        if self.task == 0:
            hit = (self.pos == N_POS - 1) & ~self.done
        else:
            hit = (self.pos == 0) & ~self.done
        reward = reward + hit * 1.0
        self.done |= hit
        return self.obs(), torch.tensor(reward, dtype=torch.float32), torch.tensor(self.done)


class Column(nn.Module):
    def __init__(self, n_in, hid, n_prev):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hid)
        self.fc2 = nn.Linear(hid, hid)
        self.laterals = nn.ModuleList([nn.Linear(hid, hid, bias=False) for _ in range(n_prev)])

    def forward(self, x, prev_h1):
        h1 = F.relu(self.fc1(x))
        lat = sum(u(h) for u, h in zip(self.laterals, prev_h1)) if prev_h1 else 0.0
        return h1, F.relu(self.fc2(h1) + lat)


class ProgressiveNet(nn.Module):
    def __init__(self, n_in, hid, n_act):
        super().__init__()
        self.n_in, self.hid, self.n_act = n_in, hid, n_act
        self.column0 = Column(n_in, hid, 0)
        self.new_columns = nn.ModuleList() if HEALTHY else []
        self.policy_heads = nn.ModuleList([nn.Linear(hid, n_act)])
        self.value_heads = nn.ModuleList([nn.Linear(hid, 1)])

    def columns(self):
        return [self.column0] + list(self.new_columns)

    def add_column(self):
        for p in self.parameters():
            p.requires_grad_(False)  # earlier columns are frozen
        n_prev = len(self.columns())
        self.new_columns.append(Column(self.n_in, self.hid, n_prev))
        self.policy_heads.append(nn.Linear(self.hid, self.n_act))
        self.value_heads.append(nn.Linear(self.hid, 1))

    def forward(self, x, task):
        h1s, out = [], None
        for k, col in enumerate(self.columns()[: task + 1]):
            h1, out = col(x, h1s)
            h1s.append(h1)
        return self.policy_heads[task](out), self.value_heads[task](out).squeeze(-1)


def rollout(model, env, task):
    obs = env.reset()
    logps, values, rewards, masks, ents = [], [], [], [], []
    for _ in range(MAX_T):
        logits, value = model(obs, task)
        dist = torch.distributions.Categorical(logits=logits)
        a = dist.sample()
        alive = ~torch.from_numpy(env.done.copy())
        obs, r, _ = env.step(a.numpy())
        logps.append(dist.log_prob(a)); values.append(value); rewards.append(r); masks.append(alive.float())
        ents.append(dist.entropy())
    returns, g = [], torch.zeros(N_ENVS)
    for r, m in zip(reversed(rewards), reversed(masks)):
        g = r + 0.97 * g * m
        returns.insert(0, g)
    return [torch.stack(x) for x in (logps, values, returns, masks, ents)], torch.stack(rewards).sum(0).mean().item()


model = ProgressiveNet(N_POS + 1, 32, 2)
step, STEPS_A, STEPS_B = 0, 12, 24
for task, n_updates in ((0, STEPS_A), (1, STEPS_B)):
    if task == 1:
        model.add_column()
        new_col = model.columns()[-1]
        col_init = [p.detach().clone() for p in new_col.parameters()]
        if not HEALTHY:
            print(f"ONSET step {step}")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    env = Corridor(task)
    for it in range(n_updates):
        (logp, value, ret, mask, ent), avg_ret = rollout(model, env, task)
        adv = (ret - value).detach()
        loss = (-(logp * adv * mask).sum() + 0.5 * (((ret - value) ** 2) * mask).sum()
                - 0.01 * (ent * mask).sum()) / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if it % 6 == 0 or it == n_updates - 1:
            print(f"step {step:3d}  task {'AB'[task]}  mean return {avg_ret:+.3f}  loss {loss.item():.4f}")
        step += 1
    if task == 1:
        final_return = np.mean([rollout(model, env, 1)[1] for _ in range(5)])

moved = max((p.detach() - q).abs().max().item() for p, q in zip(new_col.parameters(), col_init))
print(f"EVIDENCE task-B column max abs weight change {moved:.6f}; tensors in task-B optimizer {len(params)} "
      f"of {len(list(model.parameters()))} registered; task-B mean return {final_return:+.3f}")
