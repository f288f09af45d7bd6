"""DDP toy DDPM whose mid-run resume restores rank 0's RNG state on every rank.

Bug class: RNG streams made identical across ranks (per-rank randomness collapsed
after a checkpoint resume).

Modelled on: radixark/miles PR #3187 "fix(fsdp): preserve each rank's RNG state in
checkpoints" (checkpoints saved rank 0's RNG state and restored it on every rank)
and NVIDIA/Megatron-LM PR #6858 "fix: restore each rank's own RNG state on
checkpoint load" (only one rank's RNG state was written and its peers restored
it, so the ranks resumed on the same random stream).  The program is a
hand-written DDPM training loop (epsilon-prediction MLP with a sinusoidal
timestep embedding on 2-D data, linear beta schedule, AdamW, grad clipping),
DDP over two gloo ranks with a DistributedSampler.  Each rank seeds its own
stream (``seed + rank``) for the diffusion timesteps and the Gaussian noise.
Partway through, the job checkpoints and resumes (as after a preemption):
rank 0 writes model, optimizer, step and its RNG state; every rank rebuilds the
model and optimizer and loads that checkpoint.

What goes wrong: every rank calls ``torch.set_rng_state`` with rank 0's saved
state, so from the resume on both ranks draw exactly the same timesteps and the
same noise tensors for their (different) data shards.  Half of the noise samples
per global batch are duplicates, so the all-reduced gradient is noisier and
biased toward the timesteps rank 0 happens to draw.  Nothing errors; the loss
looks as before.

Healthy twin: each rank saves its own RNG state to its own file and restores it.

Onset: 512 points / 2 ranks / batch 32 = 8 optimizer steps per epoch; the resume
happens after epoch 2 (RESUME_AFTER_EPOCH), i.e. after steps 0..23, so the first
step drawn from the collapsed RNG stream is K = 24.  Training runs 8 epochs =
64 steps (40 buggy).

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_ddp_diffusion_resume_rank0_rng.py [--healthy]
"""
import math
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

N_POINTS, BATCH = 512, 32
EPOCHS, RESUME_AFTER_EPOCH = 8, 2
T_STEPS = 100
SEED = 1234


def make_data(gen):
    """Mixture of 8 Gaussians on a ring (the usual 2-D diffusion toy)."""
    k = torch.randint(0, 8, (N_POINTS,), generator=gen)
    ang = k.float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(ang), torch.sin(ang)], 1) * 2.0
    return centers + 0.15 * torch.randn(N_POINTS, 2, generator=gen)


def timestep_embedding(t, dim=32):
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], 1)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.t_mlp = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 64))
        self.inp = nn.Linear(2, 64)
        self.net = nn.Sequential(nn.SiLU(), nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(),
                                 nn.Linear(128, 2))

    def forward(self, x, t):
        return self.net(self.inp(x) + self.t_mlp(timestep_embedding(t)))


def build(rank):
    torch.manual_seed(0)  # identical initial weights on every rank
    model = DDP(Denoiser())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    return model, optimizer


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    data = make_data(torch.Generator().manual_seed(4))
    dataset = TensorDataset(data)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    betas = torch.linspace(1e-4, 0.05, T_STEPS)
    alpha_bar = torch.cumprod(1 - betas, 0)

    ckpt_dir = [tempfile.mkdtemp(prefix="ddpm_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(ckpt_dir, src=0)
    ckpt_dir = ckpt_dir[0]

    model, optimizer = build(rank)
    torch.manual_seed(SEED + rank)  # per-rank stream for timesteps and noise

    step = 0
    for epoch in range(EPOCHS):
        if epoch == RESUME_AFTER_EPOCH + 1:
            # ---- checkpoint, then resume as a restarted job would ----
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step, "epoch": epoch, "rng": torch.get_rng_state()},
                           os.path.join(ckpt_dir, "last.pt"))
            if HEALTHY:
                torch.save(torch.get_rng_state(), os.path.join(ckpt_dir, f"rng_rank{rank}.pt"))
            dist.barrier()
            del model, optimizer
            model, optimizer = build(rank)
            ckpt = torch.load(os.path.join(ckpt_dir, "last.pt"), weights_only=True)
            model.module.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            step = ckpt["step"]
            if HEALTHY:
                torch.set_rng_state(torch.load(os.path.join(ckpt_dir, f"rng_rank{rank}.pt"), weights_only=True))
            else:
                torch.set_rng_state(ckpt["rng"])  # BUG: rank 0's stream restored on every rank
                if rank == 0:
                    print(f"ONSET step {step}")
            dist.barrier()
        sampler.set_epoch(epoch)
        model.train()
        loss_sum, n = 0.0, 0
        for (x0,) in loader:
            t = torch.randint(0, T_STEPS, (x0.shape[0],))
            noise = torch.randn_like(x0)
            ab = alpha_bar[t][:, None]
            xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
            loss = F.mse_loss(model(xt, t), noise)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_sum += loss.item()
            n += 1
            step += 1
        if rank == 0 and (epoch + 1) % 2 == 0:
            print(f"epoch {epoch} step {step} rank0_loss {loss_sum / n:.4f}")

    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print("done")
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
