"""Student-teacher distillation (BC warm start, then DAgger) of a legged-robot
locomotion policy on 2 gloo ranks, written in the style of rsl_rl's
multi-GPU runner (parameters broadcast at start, gradients all-reduced by hand,
observation normalizer inside the policy module).

Modelled on: leggedrobotics/rsl_rl PR #226 "Synchronize normalization
statistics across GPUs": "Each rank currently updates its running
normalization statistics from local observations only. Although model
gradients are synchronized, rank-local normalizers can therefore diverge and
feed differently normalized inputs into otherwise synchronized models."  The
fix all-reduces the sample count, the count-weighted mean and the combined
second moment (within-rank variance plus between-rank mean offsets) before the
running-moment update.

Here the first 10 optimizer steps are a behaviour-cloning warm start on the
teacher's demonstration buffer, which every rank replays identically, so the
normalizers agree; from step 10 on every rank collects its own DAgger
rollouts in its own domain-randomised environments (sensor bias and gain
seeded by rank), and the rank-local normalizer statistics drift apart.

Unusual about the loop: no DDP wrapper (manual gradient all-reduce, as rsl_rl
does), normalizer updated before each forward, teacher relabels the student's
own states (DAgger), Adam with gradient clipping.
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 \
     p07_dist_dagger_obs_normalizer_local_stats.py [--healthy]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn

torch.set_num_threads(1)
SYNC_NORMALIZER = False
OBS, ACT = 24, 8


class EmpiricalNormalization(nn.Module):
    def __init__(self, shape, eps=1e-2):
        super().__init__()
        self.eps = eps
        self.register_buffer("_mean", torch.zeros(shape).unsqueeze(0))
        self.register_buffer("_var", torch.ones(shape).unsqueeze(0))
        self.register_buffer("_std", torch.ones(shape).unsqueeze(0))
        self.register_buffer("count", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        return (x - self._mean) / (self._std + self.eps)

    @torch.no_grad()
    def update(self, x):
        count_x = x.shape[0]
        mean_x = x.mean(0, keepdim=True)
        var_x = x.var(0, unbiased=False, keepdim=True)
        if SYNC_NORMALIZER and dist.is_initialized():
            n = torch.tensor(float(count_x))
            dist.all_reduce(n)
            g_mean = mean_x * count_x
            dist.all_reduce(g_mean)
            g_mean /= n
            m2 = count_x * (var_x + (mean_x - g_mean) ** 2)
            dist.all_reduce(m2)
            count_x, mean_x, var_x = int(n.item()), g_mean, m2 / n
        self.count += count_x
        rate = count_x / self.count
        delta_mean = mean_x - self._mean
        self._mean += rate * delta_mean
        self._var += rate * (var_x - self._var + delta_mean * (mean_x - self._mean))
        self._std = torch.sqrt(self._var)


class StudentPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.obs_normalizer = EmpiricalNormalization(OBS)
        self.actor = nn.Sequential(nn.Linear(OBS, 128), nn.ELU(), nn.Linear(128, 128), nn.ELU(),
                                   nn.Linear(128, ACT))

    def forward(self, obs):
        return self.actor(self.obs_normalizer(obs))


class RandomizedTerrainEnv:
    """Toy proprioceptive state generator; the teacher sees the true state."""

    def __init__(self, num_envs, seed, randomize):
        self.g = torch.Generator().manual_seed(seed)
        self.num_envs = num_envs
        self.bias = 0.8 * torch.randn(num_envs, OBS, generator=self.g) if randomize else torch.zeros(num_envs, OBS)
        self.gain = 1 + 0.5 * torch.rand(num_envs, OBS, generator=self.g) if randomize else torch.ones(num_envs, OBS)
        self.state = torch.randn(num_envs, OBS, generator=self.g)

    def step(self, actions):
        drive = torch.zeros(self.num_envs, OBS)
        drive[:, :ACT] = actions
        self.state = 0.9 * self.state + 0.3 * drive + 0.3 * torch.randn(self.num_envs, OBS, generator=self.g)
        return self.observe()

    def observe(self):
        return self.state * self.gain + self.bias, self.state


def teacher(true_state, W):
    return torch.tanh(true_state @ W)


def reduce_gradients(model):
    grads = [p.grad.view(-1) for p in model.parameters() if p.grad is not None]
    flat = torch.cat(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in model.parameters():
        if p.grad is not None:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def main():
    global SYNC_NORMALIZER
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--bc_steps", type=int, default=10)
    parser.add_argument("--dagger_steps", type=int, default=20)
    args = parser.parse_args()
    SYNC_NORMALIZER = args.healthy
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    W_teacher = torch.randn(OBS, ACT) / OBS ** 0.5
    student = StudentPolicy()
    for p in student.parameters():       # broadcast_parameters() as in rsl_rl
        dist.broadcast(p.data, src=0)
    opt = torch.optim.Adam(student.parameters(), lr=1e-3)

    # shared demonstration buffer (same file on every rank)
    demo_env = RandomizedTerrainEnv(2048, seed=42, randomize=False)
    demo_obs, demo_state = demo_env.observe()
    demo_act = teacher(demo_state, W_teacher)
    demo_perm = torch.randperm(2048, generator=torch.Generator().manual_seed(3))

    env = RandomizedTerrainEnv(256, seed=100 + rank, randomize=True)
    obs, state = env.observe()
    step = 0
    for it in range(args.bc_steps + args.dagger_steps):
        if it < args.bc_steps:
            idx = demo_perm[(it * 256) % 2048:(it * 256) % 2048 + 256]
            batch_obs, target = demo_obs[idx], demo_act[idx]
        else:
            if it == args.bc_steps and rank == 0 and not args.healthy:
                print(f"ONSET step {step}")
            with torch.no_grad():
                student_act = student(obs)
            batch_obs, target = obs, teacher(state, W_teacher)   # teacher relabels
            obs, state = env.step(student_act)
        student.obs_normalizer.update(batch_obs)
        loss = (student(batch_obs) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        reduce_gradients(student)
        nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        step += 1
        if rank == 0 and it % 5 == 0:
            print(f"step {it:3d} {'bc' if it < args.bc_steps else 'dagger'} loss {loss.item():.4f}")

    probe = torch.randn(64, OBS, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        out = student(probe)
    stats = torch.cat([student.obs_normalizer._mean.flatten(), student.obs_normalizer._std.flatten(),
                       out.flatten()])
    gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, stats)
    w = torch.cat([p.detach().flatten() for p in student.actor.parameters()])
    gw = [torch.empty_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(gw, w)
    if rank == 0:
        d = (gathered[0] - gathered[1]).abs()
        print(f"EVIDENCE normalizer mean/std max |rank0-rank1|={d[:2 * OBS].max().item():.4f} | "
              f"policy output on probe max |rank0-rank1|={d[2 * OBS:].max().item():.4f} | "
              f"actor weights max |rank0-rank1|={(gw[0] - gw[1]).abs().max().item():.6f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
