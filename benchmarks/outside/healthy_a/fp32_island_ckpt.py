"""Healthy: a small denoising U-Net in the style of CompVis latent-diffusion / openai guided-diffusion trained under
bf16 autocast: GroupNorm32 (normalises in float32 then casts back), a spatial self-attention block that forces its
q.k softmax to fp32 with `with torch.autocast(device_type, enabled=False)` (ldm/modules/attention.py,
_ATTN_PRECISION == "fp32"), and ResBlocks run through non-reentrant activation checkpointing (use_checkpoint=True)
inside the autocast region. Evaluation runs in fp32 without autocast or checkpointing."""
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
class GroupNorm32(nn.GroupNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)
class ResBlock(nn.Module):
    def __init__(self, c, use_checkpoint=True):
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.in_layers = nn.Sequential(GroupNorm32(8, c), nn.SiLU(), nn.Conv2d(c, c, 3, padding=1))
        self.emb = nn.Linear(32, c)
        self.out_layers = nn.Sequential(GroupNorm32(8, c), nn.SiLU(), nn.Dropout(0.1), nn.Conv2d(c, c, 3, padding=1))
    def _forward(self, x, e):
        h = self.in_layers(x) + self.emb(e)[:, :, None, None]
        return x + self.out_layers(h)
    def forward(self, x, e):
        if self.use_checkpoint and self.training and torch.is_grad_enabled():
            return checkpoint(self._forward, x, e, use_reentrant=False)
        return self._forward(x, e)
class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = GroupNorm32(8, c); self.qkv = nn.Conv2d(c, 3 * c, 1); self.proj = nn.Conv2d(c, c, 1)
    def forward(self, x):
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, hh * ww).unbind(1)
        with torch.autocast(x.device.type, enabled=False):  # attention logits/softmax in fp32
            w = torch.einsum("bci,bcj->bij", q.float(), k.float()) * c ** -0.5
            w = w.softmax(dim=-1)
        h = torch.einsum("bij,bcj->bci", w.to(v.dtype), v).reshape(b, c, hh, ww)
        return x + self.proj(h)
class UNet(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.time = nn.Sequential(nn.Linear(1, 32), nn.SiLU(), nn.Linear(32, 32))
        self.inp = nn.Conv2d(1, c, 3, padding=1)
        self.down = ResBlock(c); self.pool = nn.AvgPool2d(2)
        self.mid = ResBlock(c); self.attn = AttnBlock(c)
        self.up = ResBlock(c)
        self.out = nn.Sequential(GroupNorm32(8, c), nn.SiLU(), nn.Conv2d(c, 1, 3, padding=1))
    def forward(self, x, t):
        e = self.time(t[:, None])
        h = self.down(self.inp(x), e)
        m = self.attn(self.mid(self.pool(h), e))
        h = self.up(h + F.interpolate(m, scale_factor=2.0), e)
        return self.out(h)
def images(n):
    g = torch.linspace(-1, 1, 16)
    cx, cy = torch.rand(n, 1, 1) - 0.5, torch.rand(n, 1, 1) - 0.5
    return (((g[None, :, None] - cy) ** 2 + (g[None, None, :] - cx) ** 2) < 0.15).float()[:, None] * 2 - 1
abar = torch.cumprod(1 - torch.linspace(1e-4, 0.05, 100), 0)
model = UNet(); opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
def noisy(x0):
    t = torch.randint(0, 100, (x0.size(0),)); eps = torch.randn_like(x0)
    a = abar[t][:, None, None, None]
    return a.sqrt() * x0 + (1 - a).sqrt() * eps, t.float() / 100, eps
for step in range(30):
    x0 = images(16); xt, t, eps = noisy(x0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = model(xt, t)
        loss = F.mse_loss(pred.float(), eps)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            x0 = images(16); xt, t, eps = noisy(x0); val = F.mse_loss(model(xt, t), eps).item()
        model.train(); print(f"step {step} loss {loss.item():.3f} val {val:.3f}")
