"""Healthy: progressive growing as the official tkarras/progressive_growing_of_gans does it: every resolution block
exists from the start (a static network driven by a level-of-detail value), and when the LOD changes the Adam
state is reset (train.py: reset_opt_for_new_lod=True -> G_opt.reset_optimizer_state()), written in PyTorch as
re-creating Adam over the SAME parameters:
a decoder from learned per-sample latent codes (GLO-style, MSE reconstruction) starts at 8x8, grows a freshly
initialised 16x16 block + toRGB at step 20 with a linear fade-in alpha, and is evaluated at each resolution."""
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
N = 64
def targets(res):
    g = torch.linspace(0, 1, 32); k = torch.arange(N).float()[:, None, None, None] % 7 + 1
    img = torch.sin(k * 3 * g[None, None, :, None]) * torch.cos(k * 2 * g[None, None, None, :])
    return F.interpolate(img, size=(res, res), mode="area")
class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(cout, cout, 3, padding=1), nn.LeakyReLU(0.2))
    def forward(self, x): return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
class GrowingDecoder(nn.Module):
    def __init__(self, zdim=16, c=32):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(zdim, c * 4 * 4)
        self.blocks = nn.ModuleList([Block(c, c)])          # 4 -> 8
        self.to_rgb = nn.ModuleList([nn.Conv2d(c, 1, 1)])
        self.alpha = 1.0
    def grow(self):
        self.blocks.append(Block(self.c, self.c)); self.to_rgb.append(nn.Conv2d(self.c, 1, 1)); self.alpha = 0.0
    def forward(self, z):
        x = F.leaky_relu(self.fc(z).view(-1, self.c, 4, 4), 0.2)
        n = getattr(self, "active", len(self.blocks))
        for b in self.blocks[:n - 1]: x = b(x)
        out = self.to_rgb[n - 1](self.blocks[n - 1](x))
        if self.alpha < 1.0 and n > 1:
            skip = F.interpolate(self.to_rgb[n - 2](x), scale_factor=2.0, mode="nearest")
            out = self.alpha * out + (1 - self.alpha) * skip
        return out
latents = nn.Embedding(N, 16)
model = GrowingDecoder(); model.grow(); model.alpha = 1.0   # all blocks built up front (static graph)
model.active = 1
def make_opt():
    return torch.optim.Adam(list(model.parameters()) + list(latents.parameters()), lr=2e-3, betas=(0.0, 0.99))
opt = make_opt(); res = 8; fade_steps = 10
def evaluate():
    model.eval()
    with torch.no_grad():
        err = F.mse_loss(model(latents.weight), targets(res)).item()
    model.train(); return err
for step in range(40):
    if step == 20:
        print(f"res {res} eval mse {evaluate():.4f}; growing to 16x16")
        model.active = 2; model.alpha = 0.0; res = 16; opt = make_opt(); grow_at = step   # reset_opt_for_new_lod
    if res == 16 and model.alpha < 1.0:
        model.alpha = min(1.0, (step - grow_at + 1) / fade_steps)
    idx = torch.randint(0, N, (16,))
    loss = F.mse_loss(model(latents(idx)), targets(res)[idx])
    opt.zero_grad(); loss.backward(); opt.step()
print(f"res {res} eval mse {evaluate():.4f}")
