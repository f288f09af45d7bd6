"""Continued pretraining of a small Llama (transformers ``LlamaForCausalLM`` built from
a config). Stage 1 trains with fp32 weights under CPU bf16 autocast and calls
``save_pretrained``. Stage 2 reloads the checkpoint with ``from_pretrained`` to continue
at a lower LR. To save memory, stage 2 loads it with ``torch_dtype=torch.bfloat16``,
so AdamW then updates bf16 weights directly.

Modelled on: workofart/ml-by-hand PR #85 "Create FP32 master copy of weights for
mixed-precision training" ("Adam optimizer's update was computed in fp32 internally
but written back to bf16 ... each weight update step ... rounds back to 1.0"), and
vllm-project/speculators PR #765 "Fix numerical issues by holding params in fp32" (all
trained models ended up with normalization weights exactly at their initial value,
"because our training is done fully in bf16 ... the gradient update delta is smaller
than the step size"). Both fixes keep fp32 master weights and use bf16 only for compute.

What is unusual about the loop: the model object and the optimizer are rebuilt at the
stage boundary, and autocast is on in both stages. In bf16, any update smaller than
half a ULP is rounded away: about 1/256 of |w| for RMSNorm gains near 1, much less for
the small projection weights. The loss keeps falling (the projections still learn),
while the norm gains are frozen. ``--healthy`` reloads with ``torch_dtype=torch.float32``
(fp32 master weights under the same autocast).
"""
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv


NEXT = torch.randperm(60, generator=torch.Generator().manual_seed(5)) + 4  # a fixed "grammar" over tokens 4..63


def synthetic_batch(g, bs=8, seq=48, vocab=64):
    """Token chains that follow a fixed successor table, with 10% random substitutions."""
    x = torch.empty(bs, seq, dtype=torch.long)
    x[:, 0] = torch.randint(4, vocab, (bs,), generator=g)
    for t in range(1, seq):
        x[:, t] = NEXT[x[:, t - 1] - 4]
        noise = torch.rand(bs, generator=g) < 0.1
        x[noise, t] = torch.randint(4, vocab, (int(noise.sum()),), generator=g)
    return x


def train_steps(model, optimizer, sched_lrs, g, start_step, log_prefix, onset=None):
    model.train()
    for i, lr in enumerate(sched_lrs):
        step = start_step + i
        if onset is not None and step == onset:
            print(f"ONSET step {step}")
        for grp in optimizer.param_groups:
            grp["lr"] = lr
        batch = synthetic_batch(g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 6 == 5:
            print(f"{log_prefix} step {step} loss {loss.item():.4f}")
    return start_step + len(sched_lrs)


def main():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-6, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(1)

    # ----- stage 1: fp32 weights, bf16 autocast -----
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    stage1_lrs = [2e-3 * min(1.0, (i + 1) / 4) for i in range(8)]
    step = train_steps(model, opt, stage1_lrs, g, 0, "stage1")
    ckpt = tempfile.mkdtemp()
    model.save_pretrained(ckpt)
    del model, opt

    # ----- stage 2: continued pretraining from the checkpoint at a lower LR -----
    load_dtype = torch.float32 if HEALTHY else torch.bfloat16
    model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=load_dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.95), weight_decay=0.1)
    norms_before = {n: p.detach().float().clone() for n, p in model.named_parameters() if "norm" in n}
    all_before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    stage2_lrs = [5e-4] * 24
    train_steps(model, opt, stage2_lrs, g, step, "stage2", onset=None if HEALTHY else step)

    named = dict(model.named_parameters())
    norm_moved = sum((named[n].detach().float() != b).sum().item() for n, b in norms_before.items())
    norm_total = sum(b.numel() for b in norms_before.values())
    all_moved = sum((named[n].detach().float() != b).sum().item() for n, b in all_before.items())
    all_total = sum(b.numel() for b in all_before.values())
    eval_g = torch.Generator().manual_seed(99)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ev = sum(model(input_ids=b, labels=b).loss.item() for b in (synthetic_batch(eval_g) for _ in range(4))) / 4
    print(f"EVIDENCE param_dtype={next(model.parameters()).dtype} norm_weights_changed={norm_moved}/{norm_total} "
          f"all_weights_changed_frac={all_moved / all_total:.3f} eval_loss={ev:.4f}")


if __name__ == "__main__":
    main()
