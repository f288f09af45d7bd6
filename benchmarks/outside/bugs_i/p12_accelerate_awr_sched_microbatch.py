"""Offline RL (advantage-weighted regression) on logged point-mass data with accelerate + grad accumulation.

Modelled on: huggingface/accelerate#963 "Scheduler always steps when training with gradient
accumulation" -- inside ``with accelerator.accumulate(model):`` the loop calls
``optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()`` on every micro-batch; the
optimizer step is skipped on non-sync micro-batches but the scheduler "modifies learning rate at
every step, even when optimiser.step was not performed", so the schedule runs
``gradient_accumulation_steps`` times too fast.  Fixed by making the scheduler step only together
with a real optimizer step (PR #999: ``AcceleratedScheduler`` skips non-sync steps) -- which only
helps if the scheduler is passed through ``accelerator.prepare``.  Here the user built the
scheduler after ``prepare`` and never handed it over.

What is unusual about the loop: a warmup-free "stable then decay" schedule (constant learning
rate for ``--stable-steps`` optimizer steps, then linear decay), so the first optimizer steps
have exactly the intended learning rate in both variants; the buggy run enters the decay phase
``gradient_accumulation_steps`` times too early.  ``--healthy`` prepares the scheduler (the fix).
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def collect_offline_data(n_episodes=120, horizon=40, gamma=0.97, seed=0):
    """Noisy PD-controller behaviour policy on a damped 1D point mass; discounted returns-to-go."""
    g = torch.Generator().manual_seed(seed)
    states, actions, returns = [], [], []
    for _ in range(n_episodes):
        pos, vel = 2 * torch.rand(1, generator=g).item() - 1, 0.0
        ep_s, ep_a, ep_r = [], [], []
        skill = torch.rand(1, generator=g).item()
        for _ in range(horizon):
            a = -1.5 * pos - 0.8 * vel
            a = max(-1.0, min(1.0, a + (1.2 - skill) * torch.randn(1, generator=g).item()))
            ep_s.append([pos, vel])
            ep_a.append([a])
            ep_r.append(-(pos ** 2) - 0.05 * a ** 2)
            vel = 0.9 * vel + 0.1 * a
            pos = pos + 0.1 * vel
        ret, rtg = 0.0, []
        for r in reversed(ep_r):
            ret = r + gamma * ret
            rtg.append(ret)
        states += ep_s
        actions += ep_a
        returns += rtg[::-1]
    return torch.tensor(states), torch.tensor(actions), torch.tensor(returns).unsqueeze(-1)


class AWRAgent(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, 1))
        self.log_std = nn.Parameter(torch.zeros(1))
        self.value = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, s, a, ret, beta=0.5):
        v = self.value(s)
        value_loss = F.mse_loss(v, ret)
        adv = (ret - v.detach()).squeeze(-1)
        weights = torch.exp(adv / beta).clamp(max=20.0)
        mean = torch.tanh(self.policy(s))
        logp = (-0.5 * ((a - mean) / self.log_std.exp()) ** 2 - self.log_std
                - 0.5 * math.log(2 * math.pi)).sum(-1)
        policy_loss = -(weights * logp).mean()
        return policy_loss + 0.5 * value_loss, value_loss


def stable_then_decay(stable, total, final=0.1):
    def fn(k):
        if k < stable:
            return 1.0
        return max(final, 1.0 - (1.0 - final) * (k - stable) / max(1, total - stable))
    return fn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--optimizer-steps", type=int, default=40)
    p.add_argument("--gradient-accumulation-steps", type=int, default=4)
    p.add_argument("--stable-steps", type=int, default=24)
    p.add_argument("--micro-batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    s, a, ret = collect_offline_data()
    ret_mean, ret_std = ret.mean(), ret.std()
    ds = TensorDataset(s, a, (ret - ret_mean) / ret_std)
    loader = DataLoader(ds, batch_size=args.micro_batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    agent = AWRAgent()
    optimizer = torch.optim.AdamW(agent.parameters(), lr=args.lr, weight_decay=1e-4)
    agent, optimizer, loader = accelerator.prepare(agent, optimizer, loader)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, stable_then_decay(args.stable_steps, args.optimizer_steps))
    if args.healthy:
        lr_scheduler = accelerator.prepare(lr_scheduler)

    acc = args.gradient_accumulation_steps
    if not args.healthy:
        print(f"ONSET step {math.ceil((args.stable_steps - acc + 1) / acc)}")
    lr_used, opt_steps, micro = [], 0, 0
    while opt_steps < args.optimizer_steps:
        for s_b, a_b, r_b in loader:
            with accelerator.accumulate(agent):
                loss, value_loss = agent(s_b, a_b, r_b)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(agent.parameters(), 1.0)
                    lr_used.append(optimizer.param_groups[0]["lr"])
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            micro += 1
            if accelerator.sync_gradients:
                opt_steps += 1
                if opt_steps % 5 == 0:
                    accelerator.print(f"opt_step {opt_steps - 1:3d} loss {loss.item():.4f} "
                                      f"value_loss {value_loss.item():.4f} lr {lr_used[-1]:.2e}")
                if opt_steps >= args.optimizer_steps:
                    break

    unwrapped = accelerator.unwrap_model(agent)
    with torch.no_grad():
        test_s = torch.tensor([[0.8, 0.0], [-0.5, 0.3]])
        act = torch.tanh(unwrapped.policy(test_s)).squeeze(-1).tolist()
    k = math.ceil((args.stable_steps - acc + 1) / acc)
    print(f"EVIDENCE lr used at optimizer step {k} = {lr_used[k]:.2e}, at step {args.stable_steps} = "
          f"{lr_used[args.stable_steps]:.2e}, at last step = {lr_used[-1]:.2e} ({len(lr_used)} optimizer "
          f"steps, {micro} micro-batches); policy actions on probe states {[round(x, 3) for x in act]}")


if __name__ == "__main__":
    main()
