"""Modelled on karpathy/nanoGPT train.py + model.py: GPT with weight tying
(transformer.wte.weight = lm_head.weight), configure_optimizers splitting params into
decay (dim>=2) / no-decay groups — here plus a third group for the embeddings at a lower lr,
as in layer-wise-lr fine-tuning recipes —, gradient accumulation, clip_grad_norm_,
estimate_loss() under model.eval()/no_grad every eval_interval, and a per-iteration lr set by hand
in param_group['lr']; the schedule warms up from exactly 0 and cosine-decays to exactly 0 at the
last iteration. Blocks use torch.utils.checkpoint (use_reentrant=False) as HF's gradient
checkpointing does; the positional embedding is a frozen sinusoidal table (requires_grad False)."""
import math, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
torch.manual_seed(1337)
V, BLOCK, C, NL, NH = 96, 32, 64, 3, 4
data = torch.tensor([(i * 7 + (i // 5) % 11) % V for i in range(20000)])
train_data, val_data = data[:18000], data[18000:]
def get_batch(split, bs=8):
    d = train_data if split == "train" else val_data
    ix = torch.randint(len(d) - BLOCK - 1, (bs,))
    return torch.stack([d[i:i + BLOCK] for i in ix]), torch.stack([d[i + 1:i + 1 + BLOCK] for i in ix])
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = nn.MultiheadAttention(C, NH, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C), nn.Dropout(0.1))
        self.register_buffer("mask", torch.triu(torch.ones(BLOCK, BLOCK, dtype=torch.bool), 1))
    def forward(self, x):
        h = self.ln_1(x); T = x.size(1)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))
class GPT(nn.Module):
    def __init__(self, grad_ckpt=True):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        pe = torch.zeros(BLOCK, C); pos = torch.arange(BLOCK)[:, None]; div = torch.exp(torch.arange(0, C, 2) * (-math.log(1e4) / C))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.wpe = nn.Embedding.from_pretrained(pe, freeze=True)
        self.drop = nn.Dropout(0.1); self.h = nn.ModuleList(Block() for _ in range(NL)); self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.grad_ckpt = grad_ckpt
        self.embed_scale = 0.5 / 0.02  # fairseq-style embed scale so the frozen sinusoid does not drown tokens
        self.apply(self._init_weights)
    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None: nn.init.zeros_(m.bias)
    def forward(self, idx, targets=None):
        x = self.drop(self.wte(idx) * self.embed_scale + self.wpe(torch.arange(idx.size(1))))
        for b in self.h:
            x = checkpoint(b, x, use_reentrant=False) if (self.grad_ckpt and self.training) else b(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, V), targets.view(-1))
        return logits, loss
    def configure_optimizers(self, weight_decay, lr, betas):
        emb = {id(self.wte.weight)}
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in params.items() if p.dim() >= 2 and id(p) not in emb]
        nodecay = [p for n, p in params.items() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
                  {"params": nodecay, "weight_decay": 0.0, "lr_scale": 1.0},
                  {"params": [self.wte.weight], "weight_decay": 0.0, "lr_scale": 0.3}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
model = GPT()
max_iters, warmup_iters, lr_max, grad_accum, eval_interval = 40, 6, 3e-3, 2, 10
optimizer = model.configure_optimizers(0.1, lr_max, (0.9, 0.95))
def get_lr(it):  # 0 at it=0, lr_max at warmup_iters, 0 at it=max_iters-1
    if it < warmup_iters: return lr_max * it / warmup_iters
    r = (it - warmup_iters) / (max_iters - 1 - warmup_iters)
    return 0.5 * lr_max * (1 + math.cos(math.pi * r))
@torch.no_grad()
def estimate_loss():
    out = {}; model.eval()
    for split in ["train", "val"]:
        out[split] = torch.stack([model(*get_batch(split))[1] for _ in range(4)]).mean().item()
    model.train(); return out
for it in range(max_iters):
    lr = get_lr(it)
    for g in optimizer.param_groups: g["lr"] = lr * g["lr_scale"]
    if it % eval_interval == 0 or it == max_iters - 1:
        print(f"iter {it} lr {lr:.2e} {estimate_loss()}")
    for micro in range(grad_accum):
        X, Y = get_batch("train")
        _, loss = model(X, Y)
        (loss / grad_accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("final", estimate_loss(), "tied", model.wte.weight is model.lm_head.weight)
