"""DDPM on a 2-D "swiss roll" point cloud with an EMA copy of the denoiser, using accelerate.

Noise-prediction MLP with sinusoidal time embedding, linear beta schedule (T=100), AdamW with a
cosine LR schedule, and a diffusers-style ``EMAModel`` (``(1+step)/(10+step)`` warm-up capped at
0.995, ``optimization_step`` counter, ``state_dict``/``load_state_dict``).  Checkpointing follows
diffusers' training scripts: ``accelerator.save_state`` every 16 steps; the job is preempted after
the first checkpoint and a new process-like run rebuilds everything and calls
``accelerator.load_state`` before training on to step 40.  The EMA model is what gets sampled.

Modelled on: huggingface/diffusers PR #1834 "[train_text_to_image] allow using non-ema weights
for training" -- "This PR also allows checkpointing of the ema model. Currently only the train
``unet`` is checkpointed": ``accelerator.save_state`` only stores objects passed to ``prepare`` (or
registered with ``register_for_checkpointing``), so on resume the script built a fresh EMA from the
resumed UNet and its averaging restarted from zero (same report: ai2cm/ace#349 "EMA data not saved
during checkpoint").

Unusual about the loop: two Accelerator runs in one program (simulated restart), EMA updated only
when ``accelerator.sync_gradients``.  Buggy: the EMA is silently re-initialised at the resume (step
16) with its counter at 0.  ``--healthy`` registers the EMA object for checkpointing.
"""
import argparse
import copy
import math
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
T_DIFF, TOTAL_STEPS, CKPT_EVERY, BATCH = 100, 40, 16, 64


class EMAModel:
    def __init__(self, model, decay=0.995):
        self.shadow = [p.detach().clone() for p in model.parameters()]
        self.decay, self.optimization_step = decay, 0

    def get_decay(self, optimization_step):
        step = max(0, optimization_step - 1)
        return 0.0 if step <= 0 else min((1 + step) / (10 + step), self.decay)

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        d = self.get_decay(self.optimization_step)
        for s, p in zip(self.shadow, model.parameters()):
            s.sub_((1 - d) * (s - p.detach()))

    def copy_to(self, model):
        for s, p in zip(self.shadow, model.parameters()):
            p.data.copy_(s)

    def state_dict(self):
        return {"decay": self.decay, "optimization_step": self.optimization_step, "shadow": self.shadow}

    def load_state_dict(self, sd):
        self.decay, self.optimization_step = sd["decay"], sd["optimization_step"]
        self.shadow = [t.clone() for t in sd["shadow"]]


class Denoiser(nn.Module):
    def __init__(self, h=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 + 32, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU(),
                                 nn.Linear(h, h), nn.SiLU(), nn.Linear(h, 2))

    def forward(self, x, t):
        freqs = torch.exp(-math.log(1000.0) * torch.arange(16) / 16)
        ang = t[:, None].float() * freqs[None]
        return self.net(torch.cat([x, ang.sin(), ang.cos()], -1))


def swiss_roll(n, seed):
    g = torch.Generator().manual_seed(seed)
    r = 1.5 * math.pi * (1 + 2 * torch.rand(n, generator=g))
    x = torch.stack([r * torch.cos(r), r * torch.sin(r)], 1) / 10.0
    return x + 0.03 * torch.randn(n, 2, generator=g)


betas = torch.linspace(1e-4, 0.05, T_DIFF)
alphas_bar = torch.cumprod(1 - betas, 0)


def run(args, ckpt_dir, start_step, stop_step, log):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, TOTAL_STEPS) / TOTAL_STEPS)))
    loader = DataLoader(TensorDataset(swiss_roll(CKPT_EVERY * BATCH, 1)), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    ema = EMAModel(accelerator.unwrap_model(model))
    if args.healthy:
        accelerator.register_for_checkpointing(ema)
    if start_step > 0:
        accelerator.load_state(ckpt_dir)
        accelerator.print(f"resumed from {ckpt_dir} at step {start_step}; EMA step counter "
                          f"{ema.optimization_step}")
    g = torch.Generator().manual_seed(100 + start_step)
    step = start_step
    while step < stop_step:
        for (x0,) in loader:
            with accelerator.accumulate(model):
                t = torch.randint(0, T_DIFF, (x0.size(0),), generator=g)
                noise = torch.randn(x0.shape, generator=g)
                ab = alphas_bar[t][:, None]
                loss = F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step(); sched.step(); opt.zero_grad()
            if accelerator.sync_gradients:
                if step == start_step and start_step > 0 and not args.healthy:
                    print(f"ONSET step {step}", flush=True)
                ema.step(accelerator.unwrap_model(model))
                log[step] = loss.item()
                step += 1
                if step % 8 == 0:
                    accelerator.print(f"step {step:3d} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} "
                                      f"ema_decay {ema.get_decay(ema.optimization_step):.4f}")
                if step % CKPT_EVERY == 0 and step < TOTAL_STEPS:
                    accelerator.save_state(ckpt_dir)
                if step >= stop_step:
                    break
    return accelerator.unwrap_model(model), ema


@torch.no_grad()
def sample(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    for t in reversed(range(T_DIFF)):
        tt = torch.full((n,), t)
        eps = model(x, tt)
        x = (x - betas[t] / (1 - alphas_bar[t]).sqrt() * eps) / (1 - betas[t]).sqrt()
        if t > 0:
            x = x + betas[t].sqrt() * torch.randn(n, 2, generator=g)
    return x


def mmd(a, b):
    k = lambda x, y: torch.exp(-torch.cdist(x, y) ** 2 / 0.1).mean()
    return (k(a, a) + k(b, b) - 2 * k(a, b)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    ckpt_dir = tempfile.mkdtemp(prefix="ddpm_ckpt_")
    log = {}
    run(args, ckpt_dir, 0, CKPT_EVERY, log)                    # first job: preempted after ckpt
    print("--- preempted; relaunching from the last checkpoint ---", flush=True)
    model, ema = run(args, ckpt_dir, CKPT_EVERY, TOTAL_STEPS, log)
    ema_model = copy.deepcopy(model)
    ema.copy_to(ema_model)
    gap = sum(((s - p.detach()) ** 2).sum() for s, p in zip(ema.shadow, model.parameters())).sqrt().item()
    q = mmd(sample(ema_model, 512, 7), swiss_roll(512, 9))
    print(f"EVIDENCE EMA optimization_step={ema.optimization_step} after {len(log)} optimizer steps; "
          f"final EMA decay {ema.get_decay(ema.optimization_step):.4f}; ||EMA - online|| {gap:.4f}; "
          f"EMA-sample MMD to data {q:.4f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
