"""A denoising diffusion model (DDPM, noise prediction) on synthetic 8x8 images, trained through Hugging Face Accelerate.

Modelled on: lucidrains/denoising-diffusion-pytorch, its ``GaussianDiffusion`` and ``Trainer``
(https://github.com/lucidrains/denoising-diffusion-pytorch/blob/main/denoising_diffusion_pytorch/denoising_diffusion_pytorch.py)
Habits reproduced: the cosine beta schedule and every derived quantity registered as float32 buffers
through a ``register_buffer`` helper, ``extract()`` gathering per-timestep coefficients,
``q_sample``/``p_losses`` with a per-sample loss weight, sinusoidal time embeddings, a
``Trainer`` holding an ``Accelerator``: ``accelerator.prepare`` of model and optimizer, a
``cycle()`` over the DataLoader, gradient accumulation done by hand (loss divided by
``gradient_accumulate_every``, ``total_loss += loss.item()``, ``accelerator.backward``), then
``accelerator.clip_grad_norm_``, ``opt.step()``, ``opt.zero_grad()``, ``accelerator.wait_for_everyone()``
and an EMA copy updated every step; every ``save_and_sample_every`` steps the EMA model samples
with an ``@torch.inference_mode()`` reverse-diffusion loop and a milestone is saved with
``accelerator.get_state_dict``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import tempfile

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset


def exists(x):
    return x is not None


def cycle(dl):
    while True:
        for data in dl:
            yield data


def extract(a, t, x_shape):
    b, *_ = t.shape
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def cosine_beta_schedule(timesteps, s=0.008):
    """The cosine schedule of Nichol and Dhariwal: betas stay below 0.999 at any length."""
    steps = timesteps + 1
    t = torch.linspace(0, timesteps, steps, dtype=torch.float64) / timesteps
    alphas_cumprod = torch.cos((t + s) / (1 + s) * math.pi * 0.5) ** 2
    alphas_cumprod = alphas_cumprod / alphas_cumprod[0]
    betas = 1 - (alphas_cumprod[1:] / alphas_cumprod[:-1])
    return torch.clip(betas, 0, 0.999)


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim, theta=10000):
        super().__init__()
        self.dim = dim
        self.theta = theta

    def forward(self, x):
        half_dim = self.dim // 2
        emb = math.log(self.theta) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=x.device) * -emb)
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, time_emb_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.SiLU(), nn.Linear(time_emb_dim, dim_out * 2))
        self.proj1 = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.norm1 = nn.GroupNorm(4, dim_out)
        self.proj2 = nn.Conv2d(dim_out, dim_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(4, dim_out)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, time_emb):
        scale, shift = self.mlp(time_emb)[:, :, None, None].chunk(2, dim=1)
        h = F.silu(self.norm1(self.proj1(x)) * (scale + 1) + shift)
        h = F.silu(self.norm2(self.proj2(h)))
        return h + self.res_conv(x)


class Unet(nn.Module):
    """One down and one up level: enough structure for the training loop to be realistic."""

    def __init__(self, dim=16, channels=1):
        super().__init__()
        self.channels = channels
        time_dim = dim * 4
        self.time_mlp = nn.Sequential(
            SinusoidalPosEmb(dim), nn.Linear(dim, time_dim), nn.GELU(), nn.Linear(time_dim, time_dim))
        self.init_conv = nn.Conv2d(channels, dim, 7, padding=3)
        self.down = ResnetBlock(dim, dim, time_dim)
        self.downsample = nn.Conv2d(dim, dim * 2, 4, 2, 1)
        self.mid = ResnetBlock(dim * 2, dim * 2, time_dim)
        self.upsample = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(dim * 2, dim, 3, padding=1))
        self.up = ResnetBlock(dim * 2, dim, time_dim)
        self.final_conv = nn.Conv2d(dim, channels, 1)

    def forward(self, x, time):
        t = self.time_mlp(time)
        x = self.init_conv(x)
        h = self.down(x, t)
        x = self.mid(self.downsample(h), t)
        x = self.upsample(x)
        x = self.up(torch.cat((x, h), dim=1), t)
        return self.final_conv(x)


class GaussianDiffusion(nn.Module):
    def __init__(self, model, *, image_size, timesteps=1000, min_snr_gamma=5):
        super().__init__()
        self.model = model
        self.channels = model.channels
        self.image_size = image_size

        betas = cosine_beta_schedule(timesteps)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)
        self.num_timesteps = int(timesteps)

        # helper function to register buffer from float64 to float32
        def register_buffer(name, val):
            self.register_buffer(name, val.to(torch.float32))

        register_buffer("betas", betas)
        register_buffer("alphas_cumprod", alphas_cumprod)
        register_buffer("sqrt_alphas_cumprod", torch.sqrt(alphas_cumprod))
        register_buffer("sqrt_one_minus_alphas_cumprod", torch.sqrt(1.0 - alphas_cumprod))
        register_buffer("sqrt_recip_alphas_cumprod", torch.sqrt(1.0 / alphas_cumprod))
        register_buffer("sqrt_recipm1_alphas_cumprod", torch.sqrt(1.0 / alphas_cumprod - 1))

        posterior_variance = betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        register_buffer("posterior_variance", posterior_variance)
        register_buffer("posterior_log_variance_clipped", torch.log(posterior_variance.clamp(min=1e-20)))
        register_buffer("posterior_mean_coef1", betas * torch.sqrt(alphas_cumprod_prev) / (1.0 - alphas_cumprod))
        register_buffer("posterior_mean_coef2", (1.0 - alphas_cumprod_prev) * torch.sqrt(alphas) / (1.0 - alphas_cumprod))

        # min-SNR loss weighting for noise prediction
        snr = alphas_cumprod / (1 - alphas_cumprod)
        register_buffer("loss_weight", snr.clamp(max=min_snr_gamma) / snr)

    @property
    def device(self):
        return self.betas.device

    def predict_start_from_noise(self, x_t, t, noise):
        return (extract(self.sqrt_recip_alphas_cumprod, t, x_t.shape) * x_t
                - extract(self.sqrt_recipm1_alphas_cumprod, t, x_t.shape) * noise)

    def q_posterior(self, x_start, x_t, t):
        posterior_mean = (extract(self.posterior_mean_coef1, t, x_t.shape) * x_start
                          + extract(self.posterior_mean_coef2, t, x_t.shape) * x_t)
        return posterior_mean, extract(self.posterior_log_variance_clipped, t, x_t.shape)

    @torch.inference_mode()
    def p_sample(self, x, t: int):
        batched_times = torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)
        pred_noise = self.model(x, batched_times)
        x_start = self.predict_start_from_noise(x, batched_times, pred_noise).clamp(-1.0, 1.0)
        model_mean, model_log_variance = self.q_posterior(x_start, x, batched_times)
        noise = torch.randn_like(x) if t > 0 else 0.0
        return model_mean + (0.5 * model_log_variance).exp() * noise

    @torch.inference_mode()
    def sample(self, batch_size=16):
        img = torch.randn((batch_size, self.channels, self.image_size, self.image_size), device=self.device)
        for t in reversed(range(0, self.num_timesteps)):
            img = self.p_sample(img, t)
        return (img + 1) * 0.5  # unnormalize to [0, 1]

    def q_sample(self, x_start, t, noise=None):
        noise = noise if exists(noise) else torch.randn_like(x_start)
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    def p_losses(self, x_start, t, noise=None):
        noise = noise if exists(noise) else torch.randn_like(x_start)
        x = self.q_sample(x_start=x_start, t=t, noise=noise)
        model_out = self.model(x, t)
        loss = F.mse_loss(model_out, noise, reduction="none")
        loss = loss.reshape(loss.shape[0], -1).mean(dim=1)
        loss = loss * extract(self.loss_weight, t, loss.shape)
        return loss.mean()

    def forward(self, img):
        b = img.shape[0]
        t = torch.randint(0, self.num_timesteps, (b,), device=img.device).long()
        img = img * 2 - 1  # normalize [0, 1] to [-1, 1]
        return self.p_losses(img, t)


class EMA:
    """An exponential moving average of a model, kept as a frozen deep copy."""

    def __init__(self, model, beta=0.995, update_after_step=2, update_every=1):
        self.online_model = model
        self.ema_model = copy.deepcopy(model)
        self.ema_model.requires_grad_(False)
        self.beta = beta
        self.update_after_step = update_after_step
        self.update_every = update_every
        self.step = 0

    @torch.no_grad()
    def update(self):
        self.step += 1
        if self.step % self.update_every != 0:
            return
        if self.step <= self.update_after_step:
            for ema_param, param in zip(self.ema_model.parameters(), self.online_model.parameters()):
                ema_param.data.copy_(param.data)
            return
        for ema_param, param in zip(self.ema_model.parameters(), self.online_model.parameters()):
            ema_param.data.lerp_(param.data, 1.0 - self.beta)
        for ema_buffer, buffer in zip(self.ema_model.buffers(), self.online_model.buffers()):
            ema_buffer.data.copy_(buffer.data)


class Trainer:
    def __init__(self, diffusion_model, dataset, *, train_batch_size=8, gradient_accumulate_every=2,
                 train_lr=8e-5, train_num_steps=20, adam_betas=(0.9, 0.99), save_and_sample_every=5,
                 num_samples=4, results_folder=None, max_grad_norm=1.0):
        self.accelerator = Accelerator(cpu=True, mixed_precision="no")
        self.model = diffusion_model
        self.num_samples = num_samples
        self.save_and_sample_every = save_and_sample_every
        self.batch_size = train_batch_size
        self.gradient_accumulate_every = gradient_accumulate_every
        self.max_grad_norm = max_grad_norm
        self.train_num_steps = train_num_steps

        dl = DataLoader(dataset, batch_size=train_batch_size, shuffle=True, drop_last=True)
        dl = self.accelerator.prepare(dl)
        self.dl = cycle(dl)

        self.opt = Adam(diffusion_model.parameters(), lr=train_lr, betas=adam_betas)
        if self.accelerator.is_main_process:
            self.ema = EMA(diffusion_model)
        self.results_folder = results_folder
        self.step = 0
        self.model, self.opt = self.accelerator.prepare(self.model, self.opt)

    @property
    def device(self):
        return self.accelerator.device

    def save(self, milestone):
        if not self.accelerator.is_local_main_process:
            return
        data = {
            "step": self.step,
            "model": self.accelerator.get_state_dict(self.model),
            "opt": self.opt.state_dict(),
            "ema": self.ema.ema_model.state_dict(),
        }
        torch.save(data, os.path.join(self.results_folder, f"model-{milestone}.pt"))

    def train(self):
        accelerator = self.accelerator
        device = accelerator.device

        while self.step < self.train_num_steps:
            self.model.train()
            total_loss = 0.0

            for _ in range(self.gradient_accumulate_every):
                data = next(self.dl)[0].to(device)

                with self.accelerator.autocast():
                    loss = self.model(data)
                    loss = loss / self.gradient_accumulate_every
                    total_loss += loss.item()

                self.accelerator.backward(loss)

            accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            print(f"step {self.step}: loss: {total_loss:.4f}")

            accelerator.wait_for_everyone()

            self.opt.step()
            self.opt.zero_grad()

            accelerator.wait_for_everyone()

            self.step += 1
            if accelerator.is_main_process:
                self.ema.update()

                if self.step != 0 and self.step % self.save_and_sample_every == 0:
                    self.ema.ema_model.eval()

                    with torch.inference_mode():
                        milestone = self.step // self.save_and_sample_every
                        all_images = self.ema.ema_model.sample(batch_size=self.num_samples)

                    torch.save(all_images, os.path.join(self.results_folder, f"sample-{milestone}.pt"))
                    self.save(milestone)

        accelerator.print("training complete")


def synthetic_images(n, size, seed):
    """Soft vertical bars at random positions, in [0, 1]."""
    generator = torch.Generator().manual_seed(seed)
    xs = torch.arange(size).float().view(1, 1, 1, size)
    centres = torch.rand(n, 1, 1, 1, generator=generator) * size
    images = torch.exp(-((xs - centres) ** 2) / 2.0).expand(n, 1, size, size)
    return TensorDataset(images.contiguous())


def main():
    parser = argparse.ArgumentParser(description="DDPM training through Accelerate on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=20, help="diffusion steps (sampling walks all of them)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--gradient-accumulate-every", type=int, default=2)
    parser.add_argument("--save-and-sample-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Unet(dim=16, channels=1)
    diffusion = GaussianDiffusion(model, image_size=8, timesteps=args.timesteps)
    with tempfile.TemporaryDirectory() as results_folder:
        trainer = Trainer(
            diffusion,
            synthetic_images(64, 8, args.seed),
            train_batch_size=args.batch_size,
            gradient_accumulate_every=args.gradient_accumulate_every,
            train_lr=8e-5,
            train_num_steps=args.steps,
            save_and_sample_every=args.save_and_sample_every,
            results_folder=results_folder,
        )
        trainer.train()


if __name__ == "__main__":
    main()
