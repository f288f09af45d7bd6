"""Modelled on huggingface/diffusers examples/unconditional_image_generation/train_unconditional.py
(DDPM training with --use_ema and --gradient_checkpointing), written in plain PyTorch on
2-D toy data (the "swiss roll" setup of many DDPM tutorials).

Exercises: activation/gradient checkpointing of residual blocks via torch.utils.checkpoint
(non-reentrant, with dropout inside, so the RNG state is replayed on recomputation); an EMA
shadow of the weights in the style of diffusers' EMAModel (decay warm-up, step(),
store()/copy_to()/restore()) that is swapped into the live model for evaluation/sampling and
swapped back afterwards so training continues from the raw weights; linear-warmup LR
schedule; gradient-norm clipping.
"""
import copy
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.manual_seed(0)


class EMAModel:
    def __init__(self, parameters, decay=0.999, min_decay=0.0, update_after_step=0, inv_gamma=1.0, power=2 / 3):
        parameters = list(parameters)
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay, self.min_decay, self.update_after_step = decay, min_decay, update_after_step
        self.inv_gamma, self.power = inv_gamma, power
        self.optimization_step = 0
        self.temp_stored_params = None

    def get_decay(self, optimization_step):
        step = max(0, optimization_step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        cur_decay_value = 1 - (1 + step / self.inv_gamma) ** -self.power
        return max(min(cur_decay_value, self.decay), self.min_decay)

    @torch.no_grad()
    def step(self, parameters):
        self.optimization_step += 1
        one_minus_decay = 1 - self.get_decay(self.optimization_step)
        for s_param, param in zip(self.shadow_params, parameters):
            if param.requires_grad:
                s_param.sub_(one_minus_decay * (s_param - param))
            else:
                s_param.copy_(param)

    def copy_to(self, parameters):
        for s_param, param in zip(self.shadow_params, parameters):
            param.data.copy_(s_param.to(param.device).data)

    def store(self, parameters):
        self.temp_stored_params = [param.detach().cpu().clone() for param in parameters]

    def restore(self, parameters):
        for c_param, param in zip(self.temp_stored_params, parameters):
            param.data.copy_(c_param.data)
        self.temp_stored_params = None


def timestep_embedding(t, dim=32):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, dim, temb_dim, dropout=0.1):
        super().__init__()
        self.norm1, self.fc1 = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.temb = nn.Linear(temb_dim, dim)
        self.norm2, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h, temb):
        x = self.fc1(F.silu(self.norm1(h))) + self.temb(F.silu(temb))
        x = self.fc2(self.dropout(F.silu(self.norm2(x))))
        return h + x


class Denoiser(nn.Module):
    def __init__(self, dim=128, n_blocks=3, temb_dim=32):
        super().__init__()
        self.inp = nn.Linear(2, dim)
        self.t_mlp = nn.Sequential(nn.Linear(temb_dim, temb_dim), nn.SiLU(), nn.Linear(temb_dim, temb_dim))
        self.blocks = nn.ModuleList([ResBlock(dim, temb_dim) for _ in range(n_blocks)])
        self.out = nn.Linear(dim, 2)
        self.gradient_checkpointing = False

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, x, t):
        temb = self.t_mlp(timestep_embedding(t))
        h = self.inp(x)
        for blk in self.blocks:
            if self.gradient_checkpointing and self.training:
                h = checkpoint(blk, h, temb, use_reentrant=False)
            else:
                h = blk(h, temb)
        return self.out(h)


def swiss_roll(n):
    t = 1.5 * math.pi * (1 + 2 * torch.rand(n))
    return torch.stack([t * torch.cos(t), t * torch.sin(t)], 1) / 10.0


T = 100
betas = torch.linspace(1e-4, 0.05, T)
alphas = 1 - betas
alphas_cumprod = torch.cumprod(alphas, 0)

model = Denoiser()
model.enable_gradient_checkpointing()
ema_model = EMAModel(model.parameters(), decay=0.9999, inv_gamma=1.0, power=3 / 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.95, 0.999), weight_decay=1e-6)
max_train_steps, warmup = 60, 10
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))


@torch.no_grad()
def sample(model, n=256):
    model.eval()
    x = torch.randn(n, 2)
    for t in reversed(range(T)):
        eps = model(x, torch.full((n,), t))
        mean = (x - betas[t] / torch.sqrt(1 - alphas_cumprod[t]) * eps) / torch.sqrt(alphas[t])
        x = mean + (torch.sqrt(betas[t]) * torch.randn_like(x) if t > 0 else 0)
    model.train()
    return x


data = swiss_roll(4096)
global_step = 0
model.train()
while global_step < max_train_steps:
    clean = data[torch.randint(0, len(data), (128,))]
    noise = torch.randn_like(clean)
    timesteps = torch.randint(0, T, (clean.shape[0],))
    a = alphas_cumprod[timesteps].sqrt()[:, None]
    s = (1 - alphas_cumprod[timesteps]).sqrt()[:, None]
    noisy = a * clean + s * noise
    loss = F.mse_loss(model(noisy, timesteps), noise)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
    ema_model.step(model.parameters())
    global_step += 1
    if global_step % 10 == 0:
        print(f"step {global_step} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.5f} "
              f"ema_decay {ema_model.get_decay(ema_model.optimization_step):.4f}")
    if global_step % 30 == 0:
        # Store the UNet parameters temporarily and load the EMA parameters to perform inference.
        ema_model.store(model.parameters())
        ema_model.copy_to(model.parameters())
        samples = sample(model)
        ema_model.restore(model.parameters())
        r = samples.norm(dim=1)
        print(f"  [ema samples] radius mean {r.mean():.3f} (data {data.norm(dim=1).mean():.3f})")

ema_copy = copy.deepcopy(model)
ema_model.copy_to(ema_copy.parameters())
torch.save(ema_copy.state_dict(), "ddpm_ema_denoiser.pt")
