"""Healthy probe: a plain Hugging Face causal LM in a hand-written PyTorch loop as in the transformers docs' "Train in native PyTorch" and run_clm_no_trainer.py, with generation between epochs as in the Hugging Face course's "train a causal language model from scratch": GPT2LMHeadModel from a tiny config, AdamW with get_linear_schedule_with_warmup (the learning rate of the first step is 0), clip_grad_norm_, model.train() / model.eval() around a perplexity evaluation under torch.no_grad(), and model.generate(do_sample=True, top_k=...) sampling from a prompt in eval mode after each epoch.

The "text" is random token ids: arithmetic progressions modulo the vocabulary size, so
the model has something to learn.
"""
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

SEED, VOCAB, LENGTH, EPOCHS = 0, 64, 16, 2
torch.manual_seed(SEED)


def progressions(n, seed):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    ids = (start + stride * torch.arange(LENGTH)) % VOCAB
    return [{"input_ids": row, "attention_mask": torch.ones_like(row)} for row in ids]


def collate(rows):
    batch = {k: torch.stack([row[k] for row in rows]) for k in rows[0]}
    batch["labels"] = batch["input_ids"].clone()
    return batch


config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.1, embd_pdrop=0.1,
                    attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
train_dl = torch.utils.data.DataLoader(progressions(40, 1), batch_size=8, shuffle=True, collate_fn=collate)
eval_dl = torch.utils.data.DataLoader(progressions(16, 2), batch_size=8, collate_fn=collate)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
total_steps = EPOCHS * len(train_dl)
lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=total_steps)
device = torch.device("cpu")
model.to(device)

completed = 0
for epoch in range(EPOCHS):
    model.train()
    for batch in train_dl:
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        completed += 1
        print(f"epoch {epoch} step {completed} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e}")

    model.eval()
    losses = []
    with torch.no_grad():
        for batch in eval_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            losses.append(model(**batch).loss.item())
    perplexity = math.exp(sum(losses) / len(losses))
    prompt = torch.tensor([[5, 7, 9]], device=device)
    sample = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, top_k=10,
                            max_new_tokens=8, pad_token_id=config.eos_token_id)
    print(f"epoch {epoch} perplexity {perplexity:.2f} sample {sample[0].tolist()}")
