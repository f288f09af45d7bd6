"""VQ-VAE with an EMA codebook, dead-code restarts and a straight-through autograd.Function,
trained with accelerate (bf16 autocast, gradient accumulation) and resumed mid-run from an
accelerator.save_state() checkpoint into freshly built model/optimizer objects.

Modelled on: rosinality/vq-vae-2-pytorch (vqvae.py `Quantize`: EMA cluster_size / embed_avg
buffers with Laplace smoothing, train_vqvae.py loss = recon + 0.25 * latent loss) and
huggingface/accelerate examples/by_feature/checkpointing.py (save_state / load_state /
skip_first_batches resume logic).

Unusual but intended:
  * the codebook is not trained by the optimizer: it lives in buffers updated in forward()
    by an exponential moving average (manual, no torch.optim);
  * codes whose EMA usage falls below a threshold are re-initialised from random encoder
    outputs of the current batch (dead-code restart), and their EMA statistics are reset;
  * the quantiser runs with autocast disabled (fp32 distances and EMA statistics) inside an
    otherwise bf16-autocast forward;
  * the quantiser output is passed through a custom torch.autograd.Function that copies the
    gradient of z_q straight to the encoder output z_e;
  * halfway through, the run saves its full state, throws the model/optimizer/scheduler
    away, rebuilds them from scratch (fresh random init, new optimizer) and load_state()s.
"""
import math
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


class StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z_e, z_q):
        return z_q.clone()

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, None


class EMAQuantize(nn.Module):
    def __init__(self, dim, n_embed, decay=0.9, eps=1e-5, dead_threshold=0.2):
        super().__init__()
        self.dim, self.n_embed, self.decay, self.eps, self.dead_threshold = dim, n_embed, decay, eps, dead_threshold
        embed = torch.randn(dim, n_embed)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.ones(n_embed))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, z_e):  # z_e: (B, H, W, C)
        with torch.autocast(z_e.device.type, enabled=False):  # codebook search + EMA in fp32
            return self._quantize(z_e)

    def _quantize(self, z_e):
        flat = z_e.reshape(-1, self.dim).float()
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed + self.embed.pow(2).sum(0, keepdim=True)
        ind = dist.argmin(1)
        onehot = F.one_hot(ind, self.n_embed).type(flat.dtype)
        if self.training:
            with torch.no_grad():
                self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
                self.embed_avg.mul_(self.decay).add_(flat.t() @ onehot, alpha=1 - self.decay)
                n = self.cluster_size.sum()
                smoothed = (self.cluster_size + self.eps) / (n + self.n_embed * self.eps) * n
                self.embed.copy_(self.embed_avg / smoothed.unsqueeze(0))
        z_q = F.embedding(ind, self.embed.t()).view_as(z_e).to(z_e.dtype)
        commit = F.mse_loss(z_q.detach().float(), z_e.float())
        return StraightThrough.apply(z_e, z_q), commit, ind

    @torch.no_grad()
    def restart_dead_codes(self, z_e):
        dead = self.cluster_size < self.dead_threshold
        n_dead = int(dead.sum())
        if n_dead:
            flat = z_e.reshape(-1, self.dim).float()
            pick = flat[torch.randint(0, flat.shape[0], (n_dead,))]
            self.embed[:, dead] = pick.t()
            self.embed_avg[:, dead] = pick.t()
            self.cluster_size[dead] = 1.0
        return n_dead


class VQVAE(nn.Module):
    def __init__(self, dim=32, n_embed=64):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(),
                                 nn.Conv2d(64, dim, 1))
        self.quant = EMAQuantize(dim, n_embed)
        self.dec = nn.Sequential(nn.Conv2d(dim, 64, 3, 1, 1), nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1),
                                 nn.ReLU(), nn.ConvTranspose2d(32, 1, 4, 2, 1))

    def encode(self, x):
        return self.enc(x).permute(0, 2, 3, 1)

    def forward(self, x):
        z_e = self.encode(x)
        z_q, commit, ind = self.quant(z_e)
        return self.dec(z_q.permute(0, 3, 1, 2)), commit, ind


def make_shapes(n, gen, size=16):
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    cx, cy = torch.randint(3, size - 3, (2, n, 1, 1), generator=gen)
    r = torch.randint(2, 5, (n, 1, 1), generator=gen)
    circle = ((xx - cx) ** 2 + (yy - cy) ** 2 <= r ** 2)
    square = ((xx - cx).abs() <= r) & ((yy - cy).abs() <= r)
    kind = torch.rand(n, 1, 1, generator=gen) < 0.5
    img = torch.where(kind, circle, square).float()
    return (img * 2 - 1).unsqueeze(1)


def build(accelerator, train_ds, total_steps):
    model = VQVAE()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    loader = DataLoader(train_ds, batch_size=32, shuffle=True, drop_last=True)
    return accelerator.prepare(model, opt, sched, loader)


def evaluate(model, x_val):
    model.eval()
    with torch.no_grad():
        rec, _, ind = model(x_val)
    model.train()
    return F.mse_loss(rec.float(), x_val).item(), ind.unique().numel()


def train_loop(accelerator, model, opt, sched, loader, x_val, start_step, stop_step):
    """Runs optimizer steps [start_step, stop_step); resumes mid-epoch with skip_first_batches."""
    accum = accelerator.gradient_accumulation_steps
    steps_per_epoch = len(loader) // accum
    opt_step = start_step
    for epoch in range(start_step // steps_per_epoch, math.ceil(stop_step / steps_per_epoch)):
        batches = loader
        if epoch == start_step // steps_per_epoch and start_step % steps_per_epoch:
            batches = accelerator.skip_first_batches(loader, (start_step % steps_per_epoch) * accum)
        for x, in batches:
            with accelerator.accumulate(model):
                rec, commit, _ = model(x)
                loss = F.mse_loss(rec.float(), x) + 0.25 * commit
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            if not accelerator.sync_gradients:
                continue
            opt_step += 1
            if opt_step % 8 == 0:
                net = accelerator.unwrap_model(model)
                with torch.no_grad():
                    n_dead = net.quant.restart_dead_codes(net.encode(x))
                mse, used = evaluate(model, x_val)
                accelerator.print(f"epoch {epoch} opt step {opt_step:2d} loss {loss.item():.4f} val mse {mse:.4f} "
                                  f"codes used {used:2d} restarted {n_dead:2d} lr {sched.get_last_lr()[0]:.2e}")
            if opt_step == stop_step:
                return opt_step
    return opt_step


def main():
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2, cpu=True)
    set_seed(0)
    gen = torch.Generator().manual_seed(0)
    train_ds = TensorDataset(make_shapes(1280, gen))   # 40 micro-batches = 20 optimizer steps per epoch
    x_val = make_shapes(256, gen)
    total_steps, save_at = 40, 26

    model, opt, sched, loader = build(accelerator, train_ds, total_steps)
    step = train_loop(accelerator, model, opt, sched, loader, x_val, 0, save_at)
    ckpt = os.path.join(tempfile.mkdtemp(), f"step_{step}")
    accelerator.save_state(ckpt)
    accelerator.print(f"saved state at step {step}; rebuilding model/optimizer/scheduler and resuming")

    # "new job": drop every reference, build fresh objects, restore them from the checkpoint
    accelerator.free_memory()
    del model, opt, sched, loader
    model, opt, sched, loader = build(accelerator, train_ds, total_steps)
    accelerator.load_state(ckpt)
    mse, used = evaluate(model, x_val)
    accelerator.print(f"  after load_state: val mse {mse:.4f} codes used {used} lr {sched.get_last_lr()[0]:.2e}")
    train_loop(accelerator, model, opt, sched, loader, x_val, step, total_steps)
    accelerator.wait_for_everyone()
    shutil.rmtree(os.path.dirname(ckpt), ignore_errors=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
