"""Healthy: torchtitan-style LM step -- forward under torch.autocast(bf16), logits upcast with .float() and the
cross-entropy computed in fp32 OUTSIDE the autocast region (torchtitan train.py + loss.cross_entropy_loss),
AdamW with linear-warmup/cosine LambdaLR, clip_grad_norm_, and an fp32 evaluation pass (no autocast) every 10 steps."""
import math, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
V, T, D = 64, 16, 64
class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D); self.pos = nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.1, batch_first=True, norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D); self.head = nn.Linear(D, V, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(T), persistent=False)
    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))
def batch(n):  # copy task with offset: next token = (prev + 3) % V, noisy start
    start = torch.randint(0, V, (n, 1)); seq = (start + 3 * torch.arange(T + 1)) % V
    return seq[:, :-1], seq[:, 1:]
model = TinyLM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
steps, warm = 40, 5
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm))))
def evaluate():
    model.eval(); tot = 0.0
    with torch.no_grad():
        for _ in range(2):
            x, y = batch(32); tot += F.cross_entropy(model(x).view(-1, V), y.reshape(-1)).item()
    model.train(); return tot / 2
for step in range(steps):
    x, y = batch(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(0, 1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()
    if step % 10 == 9:
        print(f"step {step} loss {loss.item():.3f} val {evaluate():.3f}")
