"""Small decoder-only language model with mixture-of-experts feed-forward layers (top-2
router, load-balancing auxiliary loss), trained with Accelerate, checkpointed with
save_state and resumed in a fresh set of objects with load_state.

Modelled on huggingface/accelerate examples/by_feature/checkpointing.py (save_state every
N steps into a folder, load_state on restart, skip_first_batches to continue mid-epoch,
register_for_checkpointing for an extra stateful object) applied to a Mixtral-style sparse
MoE block as in transformers' modeling_mixtral.py (softmax router, top-2 experts,
renormalised routing weights, load_balancing_loss_func added with router_aux_loss_coef).

Unusual loop: which expert parameters receive gradient changes from batch to batch (an
expert picked by no token gets none), the loss is the LM loss plus a router auxiliary term,
and the run is split in two halves: the second half rebuilds model/optimizer/scheduler from
scratch and restores them, the RNG states and a custom progress object from disk.
"""
import os
import tempfile
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
VOCAB, SEQ, DIM, N_EXP, TOPK = 32, 32, 64, 4, 2
STEPS_PER_HALF, BATCH = 40, 16


def make_corpus(n, seed):
    """Sequences from 4 'languages': each is a different affine recurrence mod VOCAB."""
    g = torch.Generator().manual_seed(seed)
    lang = torch.randint(0, 4, (n,), generator=g)
    a = torch.tensor([1, 3, 5, 7])[lang]
    b = torch.tensor([1, 2, 7, 11])[lang]
    x = torch.zeros(n, SEQ, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(1, SEQ):
        x[:, t] = (a * x[:, t - 1] + b) % VOCAB
    noise = torch.rand(n, SEQ, generator=g) < 0.05
    return TensorDataset(torch.where(noise, torch.randint(0, VOCAB, (n, SEQ), generator=g), x))


class SparseMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, N_EXP, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))
                                     for _ in range(N_EXP))

    def forward(self, x):
        B, T, D = x.shape
        flat = x.reshape(-1, D)
        probs = F.softmax(self.router(flat), dim=-1)
        weights, idx = probs.topk(TOPK, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            out.index_add_(0, tok, expert(flat[tok]) * weights[tok, slot, None])
        # Switch/Mixtral load-balancing loss: N * sum_e (fraction routed to e) * (mean prob of e)
        frac = F.one_hot(idx, N_EXP).float().sum(1).mean(0) / TOPK
        aux = N_EXP * (frac * probs.mean(0)).sum()
        return out.view(B, T, D), aux


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.moe = SparseMoE()
        self.register_buffer("causal", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.causal[:T, :T], need_weights=False)[0]
        m, aux = self.moe(self.ln2(x))
        return x + m, aux


class MoELM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok.weight   # tied
        nn.init.normal_(self.tok.weight, std=0.1)
        nn.init.normal_(self.pos.weight, std=0.1)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1)))
        aux_total = 0.0
        for blk in self.blocks:
            x, aux = blk(x)
            aux_total = aux_total + aux
        return self.head(self.ln(x)), aux_total / len(self.blocks)


class Progress:
    """Extra state saved alongside the model: steps done and the loss curve so far."""

    def __init__(self):
        self.step, self.losses = 0, []

    def state_dict(self):
        return {"step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, sd):
        self.step, self.losses = sd["step"], list(sd["losses"])


def build(accelerator):
    model = MoELM()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 6))
    loader = DataLoader(make_corpus(STEPS_PER_HALF * 2 * BATCH, 1), batch_size=BATCH, shuffle=True)
    progress = Progress()
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    accelerator.register_for_checkpointing(progress)
    return model, opt, loader, sched, progress


def train_steps(accelerator, model, opt, loader, sched, progress, until):
    model.train()
    batches = accelerator.skip_first_batches(loader, progress.step % len(loader)) if progress.step else loader
    for (ids,) in batches:
        logits, aux = model(ids[:, :-1])
        lm = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss = lm + 0.02 * aux
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        progress.step += 1
        progress.losses.append(lm.item())
        if progress.step >= until:
            break


with tempfile.TemporaryDirectory() as ckpt_root:
    set_seed(0)
    acc = Accelerator(cpu=True)
    parts = build(acc)
    train_steps(acc, *parts, until=STEPS_PER_HALF)
    ckpt = os.path.join(ckpt_root, f"step_{parts[-1].step}")
    acc.save_state(ckpt, safe_serialization=False)  # tied head/embedding weights
    first_half = parts[-1].losses[:]
    del parts, acc

    # ---- "restart": new Accelerator and objects, restore from the checkpoint ----
    set_seed(123)
    acc = Accelerator(cpu=True)
    parts = build(acc)
    acc.load_state(ckpt)
    progress = parts[-1]
    acc.print(f"resumed at step {progress.step} (saved loss curve length {len(progress.losses)})")
    train_steps(acc, *parts, until=2 * STEPS_PER_HALF)
    L = progress.losses
    acc.print("lm loss by 10 steps:", [round(sum(L[i:i + 10]) / 10, 3) for i in range(0, len(L), 10)])
    acc.print(f"total steps {progress.step}; first half identical after restore: {L[:STEPS_PER_HALF] == first_half}")
