"""Tiny LLaMA pretraining run (picotron-style) that is checkpointed and restarted part-way.

A decoder-only LLaMA (RMSNorm, RoPE, SwiGLU, untied ``final_proj``) is pretrained on a synthetic
Markov-chain token stream with AdamW + linear warm-up/cosine decay.  At step 16 the job writes a
checkpoint (weights as ``model.safetensors`` + optimizer/step in a ``.pth``) and "is preempted".
The restarted job builds the model on the meta device (``init_model_with_dematerialized_weights``),
materialises it from the safetensors file, restores optimizer state, step counter and data order,
and continues to step 40.

Modelled on: huggingface/picotron#32 "Why do we need to call `init_model_parameters` after
`load_state_dict`": in ``checkpoint.py`` ``init_model_with_materialized_weights`` loads the
checkpoint with ``model.load_state_dict(state_dict, strict=True, assign=True)`` and then calls
``initialization_manager.init_model_parameters()`` (``model.reset_parameters()``), which
"will overwrite weights from checkpoint" -- "a bug for resume training" (same problem fixed in
PrimeIntellect-ai/prime-rl#1096/#1369 by skipping weight init when restarting from a checkpoint).

Unusual about the loop: meta-device construction, ``assign=True`` loading, the optimizer state
(Adam moments of the trained weights) is restored while the weights are not, step counter and
LR schedule resume at 16.  ``--healthy`` skips the re-initialisation when resuming.
"""
import argparse
import contextlib
import math
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

torch.set_num_threads(1)
CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
           num_attention_heads=4, max_position_embeddings=64, rope_theta=10000.0)
TOTAL_STEPS, SAVE_AT, WARMUP, BSZ, SEQ = 40, 16, 6, 16, 64


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rope_cache(cfg):
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
    f = torch.outer(torch.arange(cfg["max_position_embeddings"]).float(), inv)
    return torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.h = cfg["hidden_size"], cfg["num_attention_heads"]
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate_proj = nn.Linear(d, cfg["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(d, cfg["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(cfg["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(B, T, self.h, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotate(q, cos[:T], sin[:T]), rotate(k, cos[:T], sin[:T])
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.out_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embedding = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.final_norm = RMSNorm(cfg["hidden_size"])
        self.final_proj = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        cos, sin = rope_cache(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reset_parameters(self):
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, RMSNorm):
                m.reset_parameters()

    def forward(self, ids):
        x = self.embedding(ids)
        for layer in self.decoder_layers:
            x = layer(x, self.cos, self.sin)
        return self.final_proj(self.final_norm(x))


@contextlib.contextmanager
def init_model_with_dematerialized_weights():
    old = nn.Module.register_parameter

    def register_empty_parameter(module, name, param):
        old(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(module._parameters[name].to("meta"))
    nn.Module.register_parameter = register_empty_parameter
    try:
        yield
    finally:
        nn.Module.register_parameter = old


def init_model_with_materialized_weights(model, save_dir, reinit=True):
    with safe_open(os.path.join(save_dir, "model.safetensors"), framework="pt", device="cpu") as f:
        state_dict = {k: f.get_tensor(k) for k in f.keys()}
    model.load_state_dict(state_dict, strict=True, assign=True)
    assert not any(p.is_meta for p in model.parameters())
    if reinit:
        model.reset_parameters()          # initialization_manager.init_model_parameters()
    return model


def make_stream(n_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3.0 * torch.randn(CFG["vocab_size"], CFG["vocab_size"], generator=g), -1)
    toks = [0]
    for _ in range(n_tokens - 1):
        toks.append(int(torch.multinomial(trans[toks[-1]], 1, generator=g)))
    return torch.tensor(toks)


def lr_at(step, peak=3e-3):
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    return peak * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL_STEPS - WARMUP)))


def train(model, opt, stream, start, stop, log, onset=None):
    for step in range(start, stop):
        if onset is not None and step == onset:
            print(f"ONSET step {step}", flush=True)
        g = torch.Generator().manual_seed(1000 + step)      # data order is a function of the step
        idx = torch.randint(0, len(stream) - SEQ - 1, (BSZ,), generator=g)
        batch = torch.stack([stream[i:i + SEQ + 1] for i in idx])
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, CFG["vocab_size"]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log[step] = loss.item()
        if step % 4 == 0 or step in (start, stop - 1):
            print(f"step {step:3d} | loss {loss.item():.4f} | lr {lr_at(step):.2e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(42)
    stream = make_stream(20000, 0)
    ckpt_dir = tempfile.mkdtemp(prefix="picotron_ckpt_")
    log = {}

    model = Llama(CFG)
    model.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0), betas=(0.9, 0.95), weight_decay=0.1)
    train(model, opt, stream, 0, SAVE_AT, log)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(ckpt_dir, "model.safetensors"))
    torch.save({"optimizer": opt.state_dict(), "trained_steps": SAVE_AT}, os.path.join(ckpt_dir, "state.pth"))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    del model, opt
    print("--- job preempted; restarting from checkpoint ---", flush=True)

    with init_model_with_dematerialized_weights():
        model = Llama(CFG)
    model = init_model_with_materialized_weights(model, ckpt_dir, reinit=not args.healthy)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(SAVE_AT), betas=(0.9, 0.95), weight_decay=0.1)
    state = torch.load(os.path.join(ckpt_dir, "state.pth"))
    opt.load_state_dict(state["optimizer"])
    start = state["trained_steps"]
    drift = max((v - saved[k]).abs().max().item() for k, v in model.state_dict().items())
    train(model, opt, stream, start, TOTAL_STEPS, log, onset=None if args.healthy else start)
    print(f"EVIDENCE max |weights after restore - checkpointed weights| = {drift:.4f}; "
          f"loss step {start - 1} -> {start}: {log[start - 1]:.3f} -> {log[start]:.3f}; "
          f"final loss {log[TOTAL_STEPS - 1]:.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
