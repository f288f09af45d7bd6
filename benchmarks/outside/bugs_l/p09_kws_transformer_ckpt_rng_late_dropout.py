"""Keyword spotting on log-mel-like frames with a small Transformer encoder. Activation
checkpointing is on for every block, and dropout follows the "late dropout" schedule
(Liu et al. 2023, "Dropout Reduces Underfitting"): p = 0 for the first steps, then
p = 0.1.

Modelled on: allenai/OLMo-core PR #828 "Preserve RNG state across activation-checkpoint
recompute when dropout is active". ``apply_activation_checkpointing`` hard-coded
``preserve_rng_state = False`` under a "TODO: only preserve RNG state if dropout is
active". That was harmless while no model used dropout. Once dropout was enabled, "that
recompute draws fresh dropout masks, so the gradients are taken with respect to a
different sample than the loss was" (the AC-on and AC-off runs then drifted apart).
Same bug and fix: allenai/OLMo PR #702 and ankanbhunia/PIDM PR #66.

What is unusual about the loop: the dropout probability is changed on live modules
mid-run, and every block runs under ``torch.utils.checkpoint`` (non-reentrant), so its
forward is executed twice per step. While p == 0 the recomputation is exact, so the
first steps are correct in both variants. ``--healthy`` passes
``preserve_rng_state=True``.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
N_MELS, FRAMES, N_CLASSES = 20, 32, 4


def make_batch(g, bs=32):
    """Each keyword is a distinct formant trajectory; speakers shift pitch, add noise."""
    y = torch.randint(N_CLASSES, (bs,), generator=g)
    t = torch.linspace(0, 1, FRAMES)
    mel = torch.arange(N_MELS).float()
    starts = torch.tensor([3.0, 14.0, 6.0, 11.0])
    slopes = torch.tensor([8.0, -8.0, 0.0, -5.0])
    shift = 2 * torch.randn(bs, 1, generator=g)
    centre = starts[y].unsqueeze(1) + slopes[y].unsqueeze(1) * torch.sin(torch.pi * t) + shift
    x = torch.exp(-0.5 * ((mel.view(1, 1, -1) - centre.unsqueeze(-1)) / 1.5) ** 2)
    x = x + 0.3 * torch.randn(bs, FRAMES, N_MELS, generator=g)
    return x, y


class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(p), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop(self.mlp(self.ln2(x)))


class KWSTransformer(nn.Module):
    def __init__(self, d=64, heads=4, layers=3, p=0.0, activation_checkpointing=True):
        super().__init__()
        self.inp = nn.Linear(N_MELS, d)
        self.pos = nn.Parameter(torch.zeros(1, FRAMES, d))
        self.blocks = nn.ModuleList([Block(d, heads, p) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, N_CLASSES)
        self.activation_checkpointing = activation_checkpointing
        # TODO: only preserve RNG state if dropout is active
        self.preserve_rng_state = True if HEALTHY else False

    def set_dropout(self, p):
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = p

    def forward(self, x):
        x = self.inp(x) + self.pos
        for blk in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=self.preserve_rng_state)
            else:
                x = blk(x)
        return self.head(self.norm(x).mean(dim=1))


def grad_vector(model, x, y, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def main():
    torch.manual_seed(0)
    model = KWSTransformer(p=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    g = torch.Generator().manual_seed(1)
    late_dropout_start, total_steps = 10, 36
    model.train()
    for step in range(total_steps):
        if step == late_dropout_start:
            model.set_dropout(0.1)
            if not HEALTHY:
                print(f"ONSET step {step}")
        x, y = make_batch(g)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 6 == 5:
            print(f"step {step} loss {loss.item():.4f}")

    # Gradient check on one batch: checkpointed backward vs the same forward without checkpointing.
    x, y = make_batch(torch.Generator().manual_seed(5))
    g_ckpt = grad_vector(model, x, y, seed=123)
    model.activation_checkpointing = False
    g_ref = grad_vector(model, x, y, seed=123)
    model.activation_checkpointing = True
    cos = F.cosine_similarity(g_ckpt, g_ref, dim=0).item()
    rel = ((g_ckpt - g_ref).norm() / g_ref.norm()).item()
    model.eval()
    with torch.no_grad():
        xt, yt = make_batch(torch.Generator().manual_seed(7), 256)
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    print(f"EVIDENCE grad_cos_ckpt_vs_no_ckpt={cos:.4f} grad_rel_err={rel:.4f} test_acc={acc:.3f}")


if __name__ == "__main__":
    main()
