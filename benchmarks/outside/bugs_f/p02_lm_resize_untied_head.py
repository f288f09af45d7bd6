"""Tiny causal Transformer LM with tied embeddings; adding special tokens partway unties the head.

Bug class: weight tying silently lost (tied input/output embeddings become two
independent parameters after a vocabulary resize).

Modelled on: huggingface/transformers#1730 "resize_token_embeddings doesn't work as
expected for BertForMaskedLM" (after resizing, the prediction layer was no longer
tied to the word embeddings; fixed by PR #1721) and facebookresearch/lingua#74
"How to correctly handle embedding tying?" (embeddings found untied although
weight_tying was on).  The program is a hand-written nanoGPT-style loop: token +
position embeddings, a few pre-norm Transformer blocks, ``lm_head.weight =
tok_emb.weight``, AdamW.  After a short pre-training stage the vocabulary is
extended with two special tokens for a second data format, with a hand-written
``resize_token_embeddings`` that builds a new embedding and a new head and copies
the old rows over.

What goes wrong: the resize helper copies the old weights into a fresh
``nn.Linear`` head but never re-ties it to the new embedding, so from the resize
on the model has an untied output projection: the head no longer shares updates
with the input embedding, the embedding stops receiving the output-side
gradient, and the parameter count silently grows by vocab*d.  Loss still falls.

Healthy twin: re-ties after resizing (``model.lm_head.weight = model.tok_emb.weight``).

Onset: stage 1 runs PRE_STEPS = 12 optimizer steps (0..11); the vocabulary is
resized right after, so the first step with an untied head is K = 12.  Stage 2
runs 36 more steps (48 in total).
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

BASE_VOCAB = 40
N_SPECIAL = 2  # <q> and <sep>, added for stage 2
D_MODEL, N_HEAD, N_LAYER, BLOCK = 64, 4, 2, 32
BATCH = 16
PRE_STEPS, FT_STEPS = 12, 36


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = nn.MultiheadAttention(D_MODEL, N_HEAD, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL),
                                 nn.Dropout(0.1))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, D_MODEL)
        self.pos_emb = nn.Embedding(BLOCK, D_MODEL)
        self.blocks = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        self.register_buffer("causal", torch.triu(torch.full((BLOCK, BLOCK), float("-inf")), 1))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.causal[:t, :t])
        return self.lm_head(self.ln_f(x))


def resize_token_embeddings(model, new_vocab):
    old_emb = model.tok_emb
    old_vocab = old_emb.num_embeddings
    new_emb = nn.Embedding(new_vocab, D_MODEL)
    with torch.no_grad():
        new_emb.weight[:old_vocab] = old_emb.weight
        new_emb.weight[old_vocab:] = old_emb.weight.mean(0, keepdim=True)
    model.tok_emb = new_emb
    new_head = nn.Linear(D_MODEL, new_vocab, bias=False)
    with torch.no_grad():
        new_head.weight.copy_(new_emb.weight)
    model.lm_head = new_head
    if HEALTHY:
        model.lm_head.weight = model.tok_emb.weight
    # BUG (when not HEALTHY): the new head is a copy, no longer the embedding's Parameter.


def sample_base(gen, n):
    """Stage 1 text: a noisy first-order Markov chain over the base vocabulary."""
    seq = torch.empty(n, BLOCK + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, BASE_VOCAB, (n,), generator=gen)
    for t in range(1, BLOCK + 1):
        nxt = (3 * seq[:, t - 1] + 7) % BASE_VOCAB
        noise = torch.randint(0, BASE_VOCAB, (n,), generator=gen)
        seq[:, t] = torch.where(torch.rand(n, generator=gen) < 0.8, nxt, noise)
    return seq


def sample_task(gen, n):
    """Stage 2 text: <q> then chain segments of 7 tokens, each closed by <sep> (uses the new tokens)."""
    q, sep = BASE_VOCAB, BASE_VOCAB + 1
    body = sample_base(gen, n)
    parts = [torch.full((n, 1), q)]
    for start in range(0, BLOCK, 7):
        parts += [body[:, start:start + 7], torch.full((n, 1), sep)]
    return torch.cat(parts, 1)[:, :BLOCK + 1]


def lr_at(step, total, base=1e-2, warmup=3):
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def main():
    gen = torch.Generator().manual_seed(11)
    model = TinyGPT(BASE_VOCAB)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    step = 0
    for stage, n_steps in (("pretrain", PRE_STEPS), ("task", FT_STEPS)):
        if stage == "task":
            resize_token_embeddings(model, BASE_VOCAB + N_SPECIAL)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
            if not HEALTHY:
                print(f"ONSET step {step}")
        model.train()
        losses = []
        for i in range(n_steps):
            seq = sample_base(gen, BATCH) if stage == "pretrain" else sample_task(gen, BATCH)
            x, y = seq[:, :-1], seq[:, 1:]
            for g in optimizer.param_groups:
                g["lr"] = lr_at(i, n_steps)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % 12 == 0:
                print(f"{stage} step {step} loss {sum(losses[-12:]) / len(losses[-12:]):.4f}")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"done params {n_params}")


if __name__ == "__main__":
    main()
