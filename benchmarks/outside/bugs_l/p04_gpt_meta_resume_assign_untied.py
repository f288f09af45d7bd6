"""Two-stage character-level GPT pretraining. Stage 2 ("long context" continuation)
rebuilds the model on the meta device and loads the stage-1 checkpoint with
``load_state_dict(..., assign=True)`` (the fast-init pattern used by torchtitan-style
loaders), then starts a fresh AdamW.

Modelled on: pytorch/pytorch#188346 "load_state_dict(assign=True) breaks tied (shared)
parameter and buffer aliasing". In assign mode every key gets its own Parameter, so
``transformer.wte.weight`` and ``lm_head.weight`` stop being one object.
"An optimizer constructed from the loaded module updates the formerly shared weight
twice." (Also TransformerLensOrg/TransformerLens#1725, and huggingface/accelerate#1197
fixed by PR #1204 "Fix tied weights load" for meta-device loading.) The fix (PR
#188347, and what ``PreTrainedModel.tie_weights()`` does) is to re-tie after loading.

What is unusual about the loop: the model object is replaced between stages, and the
optimizer is rebuilt with nanoGPT's decay / no-decay grouping. The two copies share
storage (``torch.load`` keeps the aliasing), so their values stay identical. Each
copy, however, gets its own AdamW state and its own (partial) gradient, and both
updates are applied to the same memory. ``--healthy`` calls ``model.tie_weights()``
after the load.
"""
import math
import os
import sys
import tempfile
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv


@dataclass
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))
        self.n_head = cfg.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd), wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]), ln_f=nn.LayerNorm(cfg.n_embd)))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def tie_weights(self):
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, lr):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def make_corpus(n_chars, seed):
    g = torch.Generator().manual_seed(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "red", "big", "house", "and", "fox"]
    out = []
    while sum(len(w) + 1 for w in out) < n_chars:
        out.append(words[int(torch.randint(len(words), (1,), generator=g))])
    text = " ".join(out) + "."
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return torch.tensor([stoi[c] for c in text], dtype=torch.long)


def get_batch(data, block, bs, g):
    ix = torch.randint(len(data) - block - 1, (bs,), generator=g)
    return torch.stack([data[i:i + block] for i in ix]), torch.stack([data[i + 1:i + 1 + block] for i in ix])


@torch.no_grad()
def estimate_loss(model, data, block):
    g = torch.Generator().manual_seed(123)
    return sum(model(*get_batch(data, block, 16, g))[1].item() for _ in range(4)) / 4


def lr_at(it, warmup, max_iters, peak):
    if it < warmup:
        return peak * (it + 1) / warmup
    return 0.1 * peak + 0.45 * peak * (1 + math.cos(math.pi * (it - warmup) / (max_iters - warmup)))


def main():
    torch.manual_seed(0)
    cfg = GPTConfig()
    data = make_corpus(20000, seed=1)
    train, val = data[:18000], data[18000:]
    g = torch.Generator().manual_seed(2)
    ckpt_dir = tempfile.mkdtemp()

    # ---------------- stage 1: short context ----------------
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 3e-3)
    stage1_iters, stage2_iters = 10, 22
    for it in range(stage1_iters):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(it, 4, stage1_iters + stage2_iters, 3e-3)
        _, loss = model(*get_batch(train, 32, 16, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"stage 1 done: iter {stage1_iters} val {estimate_loss(model, val, 32):.4f}")
    torch.save({"model": model.state_dict(), "iter_num": stage1_iters}, os.path.join(ckpt_dir, "ckpt.pt"))
    del model, opt

    # ---------------- stage 2: long context, fast init from checkpoint ----------------
    ckpt = torch.load(os.path.join(ckpt_dir, "ckpt.pt"), weights_only=True)
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(ckpt["model"], assign=True)
    if HEALTHY:
        model.tie_weights()
    opt = model.configure_optimizers(0.1, 3e-3)
    n_opt = sum(len(grp["params"]) for grp in opt.param_groups)
    print(f"stage 2: resumed at iter {ckpt['iter_num']}, optimizer holds {n_opt} tensors")
    emb_updates = []
    for it in range(ckpt["iter_num"], stage1_iters + stage2_iters):
        if not HEALTHY and it == ckpt["iter_num"]:
            print(f"ONSET step {it}")
        for grp in opt.param_groups:
            grp["lr"] = lr_at(it, 4, stage1_iters + stage2_iters, 3e-3)
        _, loss = model(*get_batch(train, 64, 8, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = model.transformer.wte.weight.detach().clone()
        opt.step()
        emb_updates.append((model.transformer.wte.weight.detach() - before).norm().item())
        if it % 8 == 7:
            print(f"iter {it} loss {loss.item():.4f}")

    tied = model.lm_head.weight is model.transformer.wte.weight
    print(f"EVIDENCE lm_head_is_wte={tied} optimizer_tensors={n_opt} "
          f"mean_wte_update_norm={sum(emb_updates) / len(emb_updates):.4f} val_loss={estimate_loss(model, val, 64):.4f}")


if __name__ == "__main__":
    main()
