"""Switch-Transformer style top-1 Mixture-of-Experts language model in Lightning.

Modelled on: the Switch Transformer recipe (Fedus, Zoph & Shazeer, JMLR 2022) as
written in google/flaxformer / mesh-tensorflow ``moe.py`` and in the PyTorch ports
such as lucidrains/st-moe-pytorch: router in float32 even under mixed precision
("selective precision"), multiplicative jitter noise on the router input during
training only, expert capacity ``capacity_factor * tokens / experts`` with overflow
tokens dropped (they pass through the residual), load-balancing auxiliary loss
``E * sum(f_i * P_i)`` and router z-loss (ST-MoE).

What is unusual about the loop (all intentional):
  * each expert only sees the tokens routed to it; an expert that receives no
    tokens in a step is skipped (no gradient, AdamW leaves it untouched);
  * tokens over capacity (a few percent here) are dropped from the expert
    computation on purpose and only flow through the residual connection;
  * the router runs in fp32 with autocast disabled while the rest runs in bf16
    (``precision="bf16-mixed"`` on CPU);
  * three loss terms with very different scales; no weight decay on router,
    norms and biases; inverse-sqrt schedule stepped per optimizer step.
"""
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)

VOCAB, SEQ, D_MODEL, N_EXPERTS = 64, 32, 64, 4


def markov_corpus(n_seq, seed):
    g = torch.Generator().manual_seed(seed)
    # sparse random transition matrix: each token has 3 likely successors
    succ = torch.randint(0, VOCAB, (VOCAB, 3), generator=torch.Generator().manual_seed(0))
    seqs = torch.empty(n_seq, SEQ + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, VOCAB, (n_seq,), generator=g)
    for t in range(1, SEQ + 1):
        choice = torch.randint(0, 3, (n_seq,), generator=g)
        nxt = succ[seqs[:, t - 1], choice]
        noise = torch.rand(n_seq, generator=g) < 0.1
        seqs[:, t] = torch.where(noise, torch.randint(0, VOCAB, (n_seq,), generator=g), nxt)
    return TensorDataset(seqs[:, :-1], seqs[:, 1:])


class ExpertFFN(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.wi = nn.Linear(d, d_ff)
        self.wo = nn.Linear(d_ff, d)

    def forward(self, x):
        return self.wo(F.gelu(self.wi(x)))


class SwitchFFN(nn.Module):
    def __init__(self, d, d_ff, n_experts, capacity_factor=1.25, jitter=0.01):
        super().__init__()
        self.router = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(ExpertFFN(d, d_ff) for _ in range(n_experts))
        self.n_experts, self.capacity_factor, self.jitter = n_experts, capacity_factor, jitter

    def forward(self, x):
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        n_tok = tokens.shape[0]
        with torch.autocast(device_type="cpu", enabled=False):
            r_in = tokens.float()
            if self.training and self.jitter > 0:
                r_in = r_in * torch.empty_like(r_in).uniform_(1 - self.jitter, 1 + self.jitter)
            router_logits = self.router(r_in)
            probs = router_logits.softmax(dim=-1)
        gate, idx = probs.max(dim=-1)
        onehot = F.one_hot(idx, self.n_experts)
        position = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1
        capacity = math.ceil(self.capacity_factor * n_tok / self.n_experts)
        keep = position < capacity

        out = torch.zeros_like(tokens, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            sel = ((idx == e) & keep).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            y = expert(tokens[sel]).float() * gate[sel].unsqueeze(-1)
            out = out.index_add(0, sel, y)

        f = onehot.float().mean(dim=0)  # fraction of tokens routed to each expert
        p = probs.mean(dim=0)  # mean router probability per expert
        aux = {"lb": self.n_experts * (f * p).sum(),
               "z": torch.logsumexp(router_logits, dim=-1).pow(2).mean(),
               "dropped": 1.0 - keep.float().mean(),
               "idle": (onehot.sum(dim=0) == 0).sum()}
        return out.view(shape).to(x.dtype), aux


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_head, batch_first=True)
        self.moe = SwitchFFN(d, 4 * d, N_EXPERTS)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        m, aux = self.moe(self.ln2(x))
        return x + m, aux


class SwitchLM(L.LightningModule):
    def __init__(self, lr=3e-3, warmup=10, lb_coef=1e-2, z_coef=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(Block(D_MODEL, 4) for _ in range(2))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.register_buffer("causal", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        auxes = []
        for blk in self.blocks:
            x, aux = blk(x, self.causal[: idx.shape[1], : idx.shape[1]])
            auxes.append(aux)
        return self.head(self.ln_f(x)), auxes

    def _loss(self, batch):
        x, y = batch
        logits, auxes = self(x)
        ce = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        lb = torch.stack([a["lb"] for a in auxes]).mean()
        z = torch.stack([a["z"] for a in auxes]).mean()
        dropped = torch.stack([a["dropped"] for a in auxes]).mean()
        idle = torch.stack([a["idle"] for a in auxes]).sum()
        return ce, lb, z, dropped, idle

    def training_step(self, batch, batch_idx):
        ce, lb, z, dropped, idle = self._loss(batch)
        loss = ce + self.hparams.lb_coef * lb + self.hparams.z_coef * z
        self.log_dict({"ce": ce, "lb": lb, "z": z, "dropped": dropped})
        if self.global_step % 10 == 0:
            print(f"step {self.global_step:3d} ce {ce.item():.3f} lb {lb.item():.3f} "
                  f"z {z.item():.2f} dropped {dropped.item():.2f} experts without tokens {idle}")
        return loss

    def validation_step(self, batch, batch_idx):
        ce, *_ = self._loss(batch)
        self.log("val_ce", ce)

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            print(f"step {self.global_step:3d} val ce {self.trainer.callback_metrics['val_ce']:.3f}")

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.ndim < 2 or "router" in name or "ln" in name or "pos" in name:
                no_decay.append(p)
            else:
                decay.append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.hparams.lr, betas=(0.9, 0.98))
        w = self.hparams.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / w, math.sqrt(w / (s + 1))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    L.seed_everything(0)
    train = DataLoader(markov_corpus(50 * 16, seed=1), batch_size=16, shuffle=True)
    val = DataLoader(markov_corpus(128, seed=2), batch_size=64)
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", max_epochs=1,
                        val_check_interval=25, gradient_clip_val=1.0,
                        logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(SwitchLM(), train, val)


if __name__ == "__main__":
    main()
