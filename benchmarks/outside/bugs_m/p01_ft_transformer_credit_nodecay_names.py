"""FT-Transformer on a synthetic credit-default table, AdamW with a decay / no-decay split.

Modelled on: karpathy/minGPT PR #16 "Fixing HuggingFace LayerNorm.weight reference"
(https://github.com/karpathy/minGPT/pull/16, follow-up PR #18): the optimizer grouping copied the
BERT recipe ``no_decay = ["bias", "LayerNorm.weight"]``, but the model's norms are plain
``nn.LayerNorm`` modules named ``ln1``/``ln_f``, so the string match never fires and the LayerNorm
gains are weight-decayed.  The same bug was fixed in deepspeedai/DeepSpeedExamples PR #755
("deepspeed-chat: fix weight decay configuration": OPT/Llama/Bloom norms are called
``layer_norm``/``norm``/``ln_f``).  The model is the FT-Transformer of Gorishniy et al. 2021
(yandex-research/rtdl), whose recipe keeps the feature tokenizer, LayerNorms and biases out of
weight decay.

Unusual about the loop: the weight-decay coefficient follows a per-iteration schedule written into
the "decay" param group by hand (DINO-style ``param_group["weight_decay"] = wd_schedule[it]``).
It is 0 during the 8-step LR warm-up and only then switched on, so the grouping mistake starts to
matter at step 8.  With ``--healthy`` the groups are built by module type (minGPT PR #18 / rtdl
style) instead of by the copied name list.
"""
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
np.random.seed(0)

# ----------------------------------------------------------------------------- data
N_TRAIN, N_VAL = 3000, 800
CAT_CARD = [6, 5, 3]  # job type, region, housing


def make_table(n, rng):
    income = rng.lognormal(10.5, 0.6, n)
    age = rng.uniform(21, 70, n)
    debt_ratio = rng.beta(2, 5, n)
    n_loans = rng.poisson(2.0, n).astype(float)
    late_90 = rng.poisson(0.3, n).astype(float)
    util = rng.uniform(0, 1.2, n)
    job = rng.integers(0, CAT_CARD[0], n)
    region = rng.integers(0, CAT_CARD[1], n)
    housing = rng.integers(0, CAT_CARD[2], n)
    logit = (-1.2 - 0.9 * (np.log(income) - 10.5) + 2.2 * debt_ratio * util + 0.8 * late_90
             - 0.02 * (age - 45) + 0.15 * n_loans + 0.5 * (job == 3) - 0.4 * (housing == 0)
             + 0.3 * np.sin(region))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    x_num = np.stack([np.log(income), age, debt_ratio, n_loans, late_90, util], 1)
    x_cat = np.stack([job, region, housing], 1)
    return x_num.astype(np.float32), x_cat.astype(np.int64), y


rng = np.random.default_rng(0)
xn_tr, xc_tr, y_tr = make_table(N_TRAIN, rng)
xn_va, xc_va, y_va = make_table(N_VAL, rng)
mu, sd = xn_tr.mean(0), xn_tr.std(0) + 1e-6  # standardise with train statistics
xn_tr, xn_va = (xn_tr - mu) / sd, (xn_va - mu) / sd
train_ds = torch.utils.data.TensorDataset(torch.from_numpy(xn_tr), torch.from_numpy(xc_tr), torch.from_numpy(y_tr))
loader = torch.utils.data.DataLoader(train_ds, batch_size=128, shuffle=True, drop_last=True,
                                     generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- model (rtdl-like names)
class FeatureTokenizer(nn.Module):
    def __init__(self, n_num, cards, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_num, d) / math.sqrt(d))
        self.bias = nn.Parameter(torch.randn(n_num + len(cards), d) / math.sqrt(d))
        self.category_embeddings = nn.Embedding(sum(cards), d)
        nn.init.normal_(self.category_embeddings.weight, std=1 / math.sqrt(d))
        self.register_buffer("category_offsets", torch.tensor([0] + cards[:-1]).cumsum(0))

    def forward(self, x_num, x_cat):
        tok_num = self.weight[None] * x_num[:, :, None]
        tok_cat = self.category_embeddings(x_cat + self.category_offsets[None])
        return torch.cat([tok_num, tok_cat], 1) + self.bias[None]


class Block(nn.Module):
    def __init__(self, d, n_heads, d_ffn, dropout):
        super().__init__()
        self.norm0 = nn.LayerNorm(d)
        self.attention = nn.MultiheadAttention(d, n_heads, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(d)
        self.linear0 = nn.Linear(d, 2 * d_ffn)  # ReGLU
        self.linear1 = nn.Linear(d_ffn, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = self.norm0(x)
        x = x + self.dropout(self.attention(h, h, h, need_weights=False)[0])
        a, b = self.linear0(self.norm1(x)).chunk(2, dim=-1)
        return x + self.dropout(self.linear1(a * F.relu(b)))


class FTTransformer(nn.Module):
    def __init__(self, n_num, cards, d=32, n_blocks=2, n_heads=4):
        super().__init__()
        self.tokenizer = FeatureTokenizer(n_num, cards, d)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) / math.sqrt(d))
        self.blocks = nn.ModuleList([Block(d, n_heads, 2 * d, 0.1) for _ in range(n_blocks)])
        self.head = nn.Sequential()
        self.head.add_module("normalization", nn.LayerNorm(d))
        self.head.add_module("activation", nn.ReLU())
        self.head.add_module("linear", nn.Linear(d, 1))

    def forward(self, x_num, x_cat):
        x = self.tokenizer(x_num, x_cat)
        x = torch.cat([x, self.cls_token.expand(len(x), -1, -1)], 1)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, -1]).squeeze(-1)


model = FTTransformer(xn_tr.shape[1], CAT_CARD)


def parameter_groups(model, weight_decay):
    if not HEALTHY:
        # copied from the BERT fine-tuning scripts
        no_decay = ["bias", "LayerNorm.weight"]
        decay = [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)]
        other = [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)]
    else:
        # by module type: tokenizer, LayerNorm, embeddings, CLS and every bias stay out of decay
        skip = set()
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.Embedding, FeatureTokenizer)):
                skip.update(id(p) for p in m.parameters(recurse=False))
        for n, p in model.named_parameters():
            if n.endswith("bias") or n == "cls_token":
                skip.add(id(p))
        decay = [p for p in model.parameters() if id(p) not in skip]
        other = [p for p in model.parameters() if id(p) in skip]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


TOTAL, WARMUP, LR, WD = 40, 8, 2e-3, 0.5
optimizer = torch.optim.AdamW(parameter_groups(model, WD), lr=LR, betas=(0.9, 0.999))
lr_schedule = [LR * (s + 1) / WARMUP if s < WARMUP else
               LR * 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (TOTAL - WARMUP))) for s in range(TOTAL)]
wd_schedule = [0.0 if s < WARMUP else WD for s in range(TOTAL)]  # no decay during warm-up

norm_types = (nn.LayerNorm, nn.Embedding, FeatureTokenizer)
norm_like = {id(p) for m in model.modules() if isinstance(m, norm_types) for p in m.parameters(recurse=False)}
norm_like |= {id(p) for n, p in model.named_parameters() if n.endswith("bias") or n == "cls_token"}
in_decay = sum(id(p) in norm_like for p in optimizer.param_groups[0]["params"])


@torch.no_grad()
def evaluate():
    model.eval()
    logits = model(torch.from_numpy(xn_va), torch.from_numpy(xc_va))
    y = torch.from_numpy(y_va).float()
    loss = F.binary_cross_entropy_with_logits(logits, y).item()
    acc = ((logits > 0).float() == y).float().mean().item()
    model.train()
    return loss, acc


step = 0
model.train()
while step < TOTAL:
    for x_num, x_cat, y in loader:
        if step >= TOTAL:
            break
        for g in optimizer.param_groups:
            g["lr"] = lr_schedule[step]
        optimizer.param_groups[0]["weight_decay"] = wd_schedule[step]
        if not HEALTHY and step == WARMUP:
            print(f"ONSET step {step}")
        loss = F.binary_cross_entropy_with_logits(model(x_num, x_cat), y.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}  lr {lr_schedule[step]:.2e}  wd {wd_schedule[step]}")
        step += 1

val_loss, val_acc = evaluate()
gains = torch.cat([m.weight.detach() for m in model.modules() if isinstance(m, nn.LayerNorm)])
print(f"val loss {val_loss:.4f}  val acc {val_acc:.3f}")
print(f"EVIDENCE tokenizer/norm/bias/cls tensors in decay group: {in_decay}/{len(norm_like)}; "
      f"mean LayerNorm gain after training {gains.mean().item():.4f}; "
      f"tokenizer weight norm {model.tokenizer.weight.norm().item():.3f}")
