"""LLaMA Pro block expansion: pre-train a small Llama, expand it with identity blocks, post-train only those.

Modelled on: TencentARC/LLaMA-Pro ``scripts/block_expansion.py`` (Wu et al., "LLaMA Pro:
Progressive LLaMA with Block Expansion", 2024) and its training recipe (the open-instruct
``llama-pro`` branch): after every ``split`` original decoder layers a copy of the last one is
inserted whose ``o_proj`` and ``down_proj`` are zero, so each new block is an identity map through
its residual connections; the model is saved with the larger ``num_hidden_layers`` and only the new
blocks are trained on the new-domain corpus while every original weight stays frozen.

Here stage 1 trains a ``LlamaForCausalLM`` (4 layers, from a ``LlamaConfig``) with the HF Trainer on
corpus A (additive progressions), the state dict is expanded to 6 layers exactly as the script does,
a new model is built from the new config and post-trained with a second Trainer (and so a new
optimizer and scheduler) on corpus B (a doubling rule), then both domains are evaluated.

Unusual but correct: the model is rebuilt in the middle of the run and gets a fresh optimizer; the new
blocks start with zero output projections, so for the first step only ``o_proj``/``down_proj`` of
the new blocks get non-zero gradients (the q/k/v/gate/up weights behind them get exact zeros) and
the loss on both domains is unchanged by the expansion (checked); about 2/3 of the parameters are
frozen in stage 2.
"""
import copy
import math
import tempfile

import numpy as np
import torch

torch.set_num_threads(1)

from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, MOD, SEQ = 64, 61, 32


def corpus_a(n, seed):
    """Arithmetic progressions x_{t+1} = x_t + d (mod MOD)."""
    g = np.random.default_rng(seed)
    start, step = g.integers(0, MOD, n), g.integers(1, 4, n)
    seqs = (start[:, None] + step[:, None] * np.arange(SEQ)[None, :]) % MOD
    return [{"input_ids": torch.tensor(s), "labels": torch.tensor(s)} for s in seqs]


def corpus_b(n, seed):
    """New domain: x_{t+1} = 2 x_t + c (mod MOD), with a domain tag token in front."""
    g = np.random.default_rng(seed)
    seqs = np.zeros((n, SEQ), dtype=np.int64)
    seqs[:, 0] = MOD + 1                       # domain tag
    c = g.integers(0, 2, n)
    seqs[:, 1] = g.integers(0, MOD, n)
    for t in range(2, SEQ):
        seqs[:, t] = (2 * seqs[:, t - 1] + c) % MOD
    return [{"input_ids": torch.tensor(s), "labels": torch.tensor(s)} for s in seqs]


def expand_state_dict(ckpt, original_layers, split):
    """Block expansion as in block_expansion.py: returns the new state dict and the new layer ids."""
    output, new_layers, layer_cnt = {}, [], 0
    for k, v in ckpt.items():
        if ".layers." not in k:
            output[k] = v
    for i in range(original_layers):
        for k in ckpt:
            if f"layers.{i}." in k:
                output[k.replace(f"layers.{i}.", f"layers.{layer_cnt}.")] = ckpt[k]
        layer_cnt += 1
        if (i + 1) % split == 0:
            for k in ckpt:
                if f"layers.{i}." in k:
                    new_k = k.replace(f"layers.{i}.", f"layers.{layer_cnt}.")
                    if "down_proj" in k or "o_proj" in k:
                        output[new_k] = torch.zeros_like(ckpt[k])
                    else:
                        output[new_k] = ckpt[k].clone()
            new_layers.append(layer_cnt)
            layer_cnt += 1
    return output, new_layers


@torch.no_grad()
def lm_loss(model, dataset):
    model.eval()
    ids = torch.stack([d["input_ids"] for d in dataset])
    return model(input_ids=ids, labels=ids).loss.item()


def training_args(out_dir, lr, steps):
    return TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=32, learning_rate=lr, max_steps=steps,
        warmup_steps=4, lr_scheduler_type="cosine", weight_decay=0.0, max_grad_norm=1.0,
        logging_steps=10, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)


def main():
    set_seed(0)
    train_a, eval_a = corpus_a(960, 1), corpus_a(128, 2)
    train_b, eval_b = corpus_b(960, 3), corpus_b(128, 4)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    base = LlamaForCausalLM(config)

    with tempfile.TemporaryDirectory() as out_dir:
        # ---- stage 1: "pre-training" on domain A ---------------------------------------------
        Trainer(model=base, args=training_args(out_dir, 3e-3, 30), train_dataset=train_a).train()
        print(f"stage 1  loss A {lm_loss(base, eval_a):.3f}  loss B {lm_loss(base, eval_b):.3f}")

        # ---- block expansion: 4 -> 6 layers ----------------------------------------------------
        split = 2
        new_state, new_layers = expand_state_dict(base.state_dict(), config.num_hidden_layers, split)
        new_config = copy.deepcopy(config)
        new_config.num_hidden_layers = config.num_hidden_layers + config.num_hidden_layers // split
        expanded = LlamaForCausalLM(new_config)
        expanded.load_state_dict(new_state, strict=True)
        la, lb = lm_loss(expanded, eval_a), lm_loss(expanded, eval_b)
        assert math.isclose(la, lm_loss(base, eval_a), rel_tol=1e-4), "expansion must preserve the function"
        assert math.isclose(lb, lm_loss(base, eval_b), rel_tol=1e-4), "expansion must preserve the function"
        print(f"expanded to {new_config.num_hidden_layers} layers, new blocks {new_layers}: "
              f"loss A {la:.3f}  loss B {lb:.3f} (unchanged)")
        del base

        # ---- stage 2: train only the new blocks on domain B (+ A at half the size, to rehearse) ----
        for name, p in expanded.named_parameters():
            p.requires_grad = any(f"layers.{i}." in name for i in new_layers)
        n_train = sum(p.numel() for p in expanded.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in expanded.parameters())
        print(f"stage 2 trains {n_train}/{n_all} parameters ({n_train / n_all:.0%})")
        frozen_before = {n: p.detach().clone() for n, p in expanded.named_parameters() if not p.requires_grad}
        mix = train_b + train_a[:480]
        Trainer(model=expanded, args=training_args(out_dir, 2e-3, 40), train_dataset=mix).train()

    print(f"stage 2  loss A {lm_loss(expanded, eval_a):.3f}  loss B {lm_loss(expanded, eval_b):.3f}")
    drift = max((p.detach() - frozen_before[n]).abs().max().item()
                for n, p in expanded.named_parameters() if n in frozen_before)
    print(f"max change of a frozen original weight: {drift:.1e}")


if __name__ == "__main__":
    main()
