"""Speedrun-style GPT training with Muon + Adam and zero-initialised output projections.

Modelled on: KellerJordan/modded-nanogpt, record ``records/111024_UNetDoubleLr`` (train_gpt2.py of
the 10 Nov 2024 record): ``Muon`` (SGD-momentum whose 2-D update is orthogonalised by a quintic
Newton-Schulz iteration in bfloat16 and scaled by sqrt(max(1, rows/cols))), four optimizers
(Adam for the embedding at lr 0.6, Adam for the lm_head, Muon for the hidden matrices, Adam for
the scalar parameters), ``CastedLinear``, QK-RMSNorm + rotary attention, ReLU^2 MLP, value
residual ``lamb``, ``lambdas`` x0-mixing, U-net skip weights, logit soft-capping ``30*tanh(z/30)``,
the trapezoidal ``get_lr`` (constant, then linear warm-down to 0) through ``LambdaLR`` on every
optimizer, the Muon momentum warm-up 0.85 -> 0.95 written into the param group, gradient
accumulation by dividing ``p.grad`` after the micro-batches.  Single process on CPU (no DDP, so
Muon is not sharded) on a synthetic Markov-chain token stream; the record's ``torch.compile``
and bfloat16 model cast are left out because on CPU they make the run many times slower
(Newton-Schulz itself still runs in bfloat16, as in the record).

Unusual (but intended) things about the loop:
* ``c_proj`` (attention and MLP) and ``lm_head`` are zero-initialised: the first step's loss is
  exactly ln(vocab) and on that step only the head gets a non-zero gradient; the blocks start
  moving from step 2 on;
* four optimizers with different algorithms and lrs step together; Muon's ``momentum`` is
  changed every step by hand; the lr ends at exactly 0 after the warm-down;
* the embedding lr is 0.6 (75x the head's); gradients are averaged over micro-batches by
  editing ``p.grad`` in place; validation on a fixed token range every 10 steps.
"""
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)


def zeropower_via_newtonschulz5(G, steps=5, eps=1e-7):
    assert len(G.shape) == 2
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    X /= (X.norm() + eps)  # ensure top singular value <= 1
    if G.size(0) > G.size(1):
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, backend_steps=5):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, backend_steps=backend_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                g = p.grad
                assert g is not None
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g)
                if group["nesterov"]:
                    g = g.add(buf, alpha=momentum)
                g = zeropower_via_newtonschulz5(g, steps=group["backend_steps"])
                g *= max(1, g.size(0) / g.size(1)) ** 0.5
                p.data.add_(g.view_as(p.data).type_as(p.data), alpha=-lr)


class Rotary(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))

    def forward(self, x):
        t = torch.arange(x.shape[1]).type_as(self.inv_freq)
        freqs = torch.outer(t, self.inv_freq)
        return freqs.cos().bfloat16()[None, :, None, :], freqs.sin().bfloat16()[None, :, None, :]


def apply_rotary_emb(x, cos, sin):
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3).type_as(x)


class CastedLinear(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.head_dim = self.n_embd // self.n_head
        self.c_q = CastedLinear(self.n_embd, self.n_embd, bias=False)
        self.c_k = CastedLinear(self.n_embd, self.n_embd, bias=False)
        self.c_v = CastedLinear(self.n_embd, self.n_embd, bias=False)
        self.c_proj = CastedLinear(self.n_embd, self.n_embd, bias=False)
        self.c_proj.weight.data.zero_()  # zero init suggested by @Grad62304977
        self.rotary = Rotary(self.head_dim)
        self.lamb = nn.Parameter(torch.tensor(0.5))

    def forward(self, x, v1=None):
        B, T, C = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if v1 is None:
            v1 = v
        v = (1 - self.lamb) * v + self.lamb * v1.view_as(v)
        cos, sin = self.rotary(q)
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view_as(x)), v1


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = CastedLinear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = CastedLinear(4 * config.n_embd, config.n_embd, bias=False)
        self.c_proj.weight.data.zero_()

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn, self.mlp = CausalSelfAttention(config), MLP(config)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, x, v1, x0):
        x = self.lambdas[0] * x + self.lambdas[1] * x0
        x1, v1 = self.attn(F.rms_norm(x, (x.size(-1),)), v1)
        x = x + x1
        return x + self.mlp(F.rms_norm(x, (x.size(-1),))), v1


@dataclass
class GPTConfig:
    vocab_size: int = 128
    n_layer: int = 4
    n_head: int = 2
    n_embd: int = 64


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(config.vocab_size, config.n_embd),
                                              h=nn.ModuleList([Block(config) for _ in range(config.n_layer)])))
        self.encoder_layers = config.n_layer // 2
        self.decoder_layers = config.n_layer - self.encoder_layers
        self.skip_weights = nn.Parameter(torch.ones(self.decoder_layers))
        self.lm_head = CastedLinear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight.data.zero_()

    def forward(self, idx, target):
        x = F.rms_norm(self.transformer.wte(idx), (self.transformer.wte.embedding_dim,))
        x0, v1, skip_connections = x, None, []
        for i in range(self.encoder_layers):
            x, v1 = self.transformer.h[i](x, v1, x0)
            skip_connections.append(x)
        for i in range(self.decoder_layers):
            x = x + self.skip_weights[i] * skip_connections.pop()
            x, v1 = self.transformer.h[self.encoder_layers + i](x, v1, x0)
        logits = self.lm_head(F.rms_norm(x, (x.size(-1),)))
        logits = (30 * torch.tanh(logits / 30)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1))


def markov_tokens(n, vocab, seed):
    """Token stream from a sparse random Markov chain (3 successors per token; a stand-in for FineWeb)."""
    table = np.random.default_rng(1).integers(0, vocab, size=(vocab, 3))
    choices = np.random.default_rng(seed).integers(0, 3, size=n)
    toks = np.empty(n, dtype=np.int64)
    toks[0] = 0
    for i in range(1, n):
        toks[i] = table[toks[i - 1], choices[i]]
    return torch.from_numpy(toks)


class DataLoaderLite:
    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T = tokens, B, T
        self.reset()

    def reset(self):
        self.pos = 0

    def next_batch(self):
        buf = self.tokens[self.pos: self.pos + self.B * self.T + 1]
        self.pos += self.B * self.T
        if self.pos + self.B * self.T + 1 > len(self.tokens):
            self.pos = 0
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


def main():
    num_iterations, warmdown_iters, val_every, accum = 40, 12, 10, 2
    B, T, vocab = 8, 64, 96
    train_loader = DataLoaderLite(markov_tokens(40000, vocab, seed=0), B, T)
    val_loader = DataLoaderLite(markov_tokens(4 * B * T + 1, vocab, seed=1), B, T)

    raw_model = GPT(GPTConfig(vocab_size=128))  # vocab padded up to a multiple of 128
    model = raw_model

    optimizer1 = torch.optim.Adam([raw_model.transformer.wte.weight], lr=0.6, betas=(0.9, 0.95))
    optimizer2 = torch.optim.Adam([raw_model.lm_head.weight], lr=0.008, betas=(0.9, 0.95))
    params = list(raw_model.transformer.h.parameters())
    matrix_params = [p for p in params if p.ndim == 2]
    scalar_params = [p for p in params if p.ndim < 2] + [raw_model.skip_weights]
    optimizer3 = Muon(matrix_params, lr=0.04, momentum=0.95)
    optimizer4 = torch.optim.Adam(scalar_params, lr=0.04, betas=(0.9, 0.95))
    optimizers = [optimizer1, optimizer2, optimizer3, optimizer4]

    def get_lr(it):
        if it < num_iterations - warmdown_iters:
            return 1.0
        return (num_iterations - it) / warmdown_iters

    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, get_lr) for opt in optimizers]
    t0 = time.time()
    x, y = train_loader.next_batch()
    for step in range(num_iterations + 1):
        last_step = step == num_iterations
        if last_step or step % val_every == 0:
            model.eval()
            val_loader.reset()
            with torch.no_grad():
                val_loss = sum(model(*val_loader.next_batch()) for _ in range(4)) / 4
            print(f"step:{step}/{num_iterations} val_loss:{val_loss:.4f} time:{time.time() - t0:.1f}s")
        if last_step:
            break
        model.train()
        for i in range(accum):
            loss = model(x, y)
            train_loss = loss.detach()
            x, y = train_loader.next_batch()
            loss.backward()
        if step <= 2:  # zero-init: lm_head first, then the c_proj's, then everything else
            watch = ["lm_head.weight", "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_fc.weight"]
            grads = dict(raw_model.named_parameters())
            print(f"step {step + 1}: non-zero grads among {watch}: "
                  f"{[n for n in watch if grads[n].grad.abs().max().item() > 0]}")
        for p in raw_model.parameters():
            p.grad /= accum
        frac = min(step / 20, 1)  # momentum warmup for Muon
        optimizer3.param_groups[0]["momentum"] = (1 - frac) * 0.85 + frac * 0.95
        for opt, sched in zip(optimizers, schedulers):
            opt.step()
            sched.step()
        raw_model.zero_grad(set_to_none=True)
        if step % 5 == 0 or step == num_iterations - 1:
            print(f"step:{step + 1}/{num_iterations} train_loss:{train_loss.item():.4f} "
                  f"lr_scale:{get_lr(step):.3f} muon_momentum:{optimizer3.param_groups[0]['momentum']:.3f}")
    print(f"ln(vocab) = {math.log(128):.4f}; final lrs {[round(s.get_last_lr()[0], 6) for s in schedulers]}")


if __name__ == "__main__":
    main()
