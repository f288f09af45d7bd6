"""Two-stage GPT-2 training: continued LM pretraining, then dialogue SFT with new role tokens.

A 2-layer GPT-2 (built from a config, no download) is first trained as a plain language model
on a synthetic corpus.  For stage 2 the vocabulary gets four new special tokens
(<|user|>, <|bot|>, <|sep|>, <|eot|>) and the model is fine-tuned on dialogue-formatted
sequences that use them, in the same Python process, with the same AdamW + linear-decay loop.

Modelled on: huggingface/transformers PR #3532 "Resizing embedding matrix before sending it to
the optimizer" (run_lm_finetuning.py): `model.resize_token_embeddings()` was called after the
optimizer had been built, so the optimizer kept the old embedding tensor and "token embeddings
were not being updated with their corresponding gradient".

Unusual about the loop: the resize happens mid-run (at the stage boundary) with a small
`grow_vocab()` helper that does what resize_token_embeddings did at the time of the PR: build a
new nn.Embedding, copy the old rows, install it and re-tie lm_head.  The old AdamW still holds
the orphaned embedding tensor, so the (tied) embedding/LM-head matrix silently stops training
while the transformer blocks keep learning and the loss keeps going down.
--healthy: the optimizer/scheduler are rebuilt on model.parameters() right after the resize.
"""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

BASE_VOCAB, N_SPECIAL, SEQ = 96, 4, 32


def lm_batches(n_batches, bs, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        start = torch.randint(0, BASE_VOCAB, (bs, 1), generator=g)
        steps = torch.randint(1, 4, (bs, SEQ), generator=g).cumsum(1)
        yield (start + steps) % BASE_VOCAB


def dialogue_batches(n_batches, bs, seed):
    user, bot, sep, eot = range(BASE_VOCAB, BASE_VOCAB + N_SPECIAL)
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        rows = []
        for _ in range(bs):
            q = torch.randint(0, BASE_VOCAB, (6,), generator=g)
            a = (q.flip(0) + 1) % BASE_VOCAB           # the "bot" answers with a transform
            turn = torch.cat([torch.tensor([user]), q, torch.tensor([sep, bot]), a, torch.tensor([eot])])
            rows.append(torch.cat([turn, turn])[:SEQ])
        yield torch.stack(rows)


def grow_vocab(model, n_new):
    old = model.get_input_embeddings()
    new = torch.nn.Embedding(old.num_embeddings + n_new, old.embedding_dim)
    new.weight.data.normal_(mean=0.0, std=model.config.initializer_range)
    new.weight.data[:old.num_embeddings] = old.weight.data
    model.set_input_embeddings(new)
    model.config.vocab_size = new.num_embeddings
    model.tie_weights()
    return new


def build_optim(model, total_steps, start_step=0):
    no_decay = ("bias", "ln_", "wpe")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
         "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=3e-3)
    for g in opt.param_groups:
        g.setdefault("initial_lr", g["lr"])
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=total_steps,
                                            last_epoch=start_step - 1)
    return opt, sched


def main():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=BASE_VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    stage1_steps, stage2_steps, bs = 12, 24, 16
    optimizer, scheduler = build_optim(model, stage1_steps + stage2_steps)

    step = 0
    model.train()
    for input_ids in lm_batches(stage1_steps, bs, seed=1):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"[lm ] step {step:3d} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
        step += 1

    # ---- stage 2: add dialogue special tokens ----
    grow_vocab(model, N_SPECIAL)
    if HEALTHY:
        optimizer, scheduler = build_optim(model, stage1_steps + stage2_steps, start_step=step)
    else:
        print(f"ONSET step {step}")
    wte = model.get_input_embeddings().weight
    new_rows_before = wte[BASE_VOCAB:].detach().clone()
    emb_before = wte.detach().clone()

    for input_ids in dialogue_batches(stage2_steps, bs, seed=2):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"[sft] step {step:3d} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
        step += 1

    wte = model.get_input_embeddings().weight
    tied = wte.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    print(f"EVIDENCE special_token_emb_change={(wte[BASE_VOCAB:] - new_rows_before).norm():.4f} "
          f"all_emb_change_stage2={(wte - emb_before).norm():.4f} lm_head_tied={tied} "
          f"final_loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
