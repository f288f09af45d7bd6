"""DDPM noise-prediction training with an EMA copy of the denoiser, on synthetic 8x8 images.

Modelled on Hugging Face diffusers ``examples/unconditional_image_generation/
train_unconditional.py`` (Ho et al., 2020, "Denoising Diffusion Probabilistic
Models"), written without diffusers:

* a linear beta schedule and ``add_noise`` (q(x_t | x_0)) as in ``DDPMScheduler``;
* a small convolutional denoiser conditioned on a sinusoidal timestep embedding,
  trained to predict the added noise with an MSE loss;
* AdamW with a linear warm-up followed by cosine decay (``get_scheduler("cosine")``
  re-implemented with ``LambdaLR``), gradient-norm clipping at 1.0;
* an exponential moving average of the weights kept in a separate, frozen copy of
  the model (``EMAModel`` with its warm-up decay ``min(decay, (1 + step) / (10 + step))``),
  updated after every optimizer step and used for validation and sampling.

Validation uses a fixed set of (x_0, t, noise) triples so losses are comparable
across evaluations.  80 optimizer steps; a few ancestral sampling steps are run
with the EMA model at the end.
"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
parser.add_argument("--train_steps", type=int, default=80)
parser.add_argument("--lr_warmup_steps", type=int, default=10)
parser.add_argument("--ema_max_decay", type=float, default=0.95)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)

T = 100
betas = torch.linspace(1e-4, 0.05, T)
alphas = 1.0 - betas
alphas_cumprod = torch.cumprod(alphas, dim=0)


def add_noise(x0, noise, t):
    sqrt_ab = alphas_cumprod[t].sqrt().view(-1, 1, 1, 1)
    sqrt_1m = (1 - alphas_cumprod[t]).sqrt().view(-1, 1, 1, 1)
    return sqrt_ab * x0 + sqrt_1m * noise


def make_images(n, gen):
    """Axis-aligned bright rectangles on a dark background, in [-1, 1]."""
    imgs = -torch.ones(n, 1, 8, 8)
    for i in range(n):
        r0, c0 = torch.randint(0, 4, (2,), generator=gen).tolist()
        h, w = torch.randint(2, 5, (2,), generator=gen).tolist()
        imgs[i, 0, r0:r0 + h, c0:c0 + w] = 1.0
    return imgs


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args_ = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args_), torch.sin(args_)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, ch, temb_dim):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, ch)
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.temb = nn.Linear(temb_dim, ch)
        self.norm2 = nn.GroupNorm(8, ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(temb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


class Denoiser(nn.Module):
    def __init__(self, ch=32, temb_dim=64):
        super().__init__()
        self.temb_dim = temb_dim
        self.time_mlp = nn.Sequential(nn.Linear(temb_dim, temb_dim), nn.SiLU(), nn.Linear(temb_dim, temb_dim))
        self.conv_in = nn.Conv2d(1, ch, 3, padding=1)
        self.blocks = nn.ModuleList([ResBlock(ch, temb_dim) for _ in range(2)])
        self.conv_out = nn.Conv2d(ch, 1, 3, padding=1)

    def forward(self, x, t):
        temb = self.time_mlp(timestep_embedding(t, self.temb_dim))
        h = self.conv_in(x)
        for blk in self.blocks:
            h = blk(h, temb)
        return self.conv_out(F.silu(h))


class EMAModel:
    """Separate frozen copy of the model holding the exponential moving average."""

    def __init__(self, model, max_decay):
        self.shadow = copy.deepcopy(model).eval()
        for p in self.shadow.parameters():
            p.requires_grad_(False)
        self.max_decay = max_decay
        self.optimization_step = 0

    def get_decay(self):
        step = self.optimization_step
        return min(self.max_decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        decay = self.get_decay()
        for s_param, param in zip(self.shadow.parameters(), model.parameters()):
            s_param.lerp_(param.detach(), 1.0 - decay)
        for s_buf, buf in zip(self.shadow.buffers(), model.buffers()):
            s_buf.copy_(buf)


def cosine_with_warmup(warmup, total):
    def lr_lambda(step):
        if step < warmup:
            return float(step + 1) / float(max(1, warmup))
        progress = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return lr_lambda


data_gen = torch.Generator().manual_seed(1)
train_images = make_images(512, data_gen)
val_x0 = make_images(128, data_gen)
val_t = torch.randint(0, T, (128,), generator=data_gen)
val_noise = torch.randn(val_x0.shape, generator=data_gen)

model = Denoiser()
ema = EMAModel(model, args.ema_max_decay)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.95, 0.999), weight_decay=1e-6)
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(args.lr_warmup_steps, args.train_steps))


@torch.no_grad()
def validate(net):
    was_training = net.training
    net.eval()
    pred = net(add_noise(val_x0, val_noise, val_t), val_t)
    loss = F.mse_loss(pred, val_noise).item()
    net.train(was_training)
    return loss


print(f"initial val loss {validate(model):.4f}")
batch_size = 32
global_step = 0
while global_step < args.train_steps:
    perm = torch.randperm(train_images.size(0))
    for i in range(0, train_images.size(0), batch_size):
        if global_step >= args.train_steps:
            break
        model.train()
        clean = train_images[perm[i:i + batch_size]]
        noise = torch.randn_like(clean)
        timesteps = torch.randint(0, T, (clean.size(0),))
        noisy = add_noise(clean, noise, timesteps)
        noise_pred = model(noisy, timesteps)
        loss = F.mse_loss(noise_pred, noise)

        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        ema.step(model)
        global_step += 1

        if global_step % 10 == 0:
            print(f"step {global_step:3d} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e} "
                  f"ema_decay {ema.get_decay():.3f} val(model) {validate(model):.4f} val(ema) {validate(ema.shadow):.4f}")

# ancestral sampling (DDPM posterior mean + sigma_t = sqrt(beta_t)) with the EMA weights
with torch.no_grad():
    x = torch.randn(4, 1, 8, 8)
    for t in reversed(range(T)):
        tt = torch.full((4,), t, dtype=torch.long)
        eps = ema.shadow(x, tt)
        mean = (x - betas[t] / (1 - alphas_cumprod[t]).sqrt() * eps) / alphas[t].sqrt()
        x = mean + (betas[t].sqrt() * torch.randn_like(x) if t > 0 else 0)
print(f"EMA samples: range [{x.min():.2f}, {x.max():.2f}], fraction > 0: {(x > 0).float().mean():.2f}")
