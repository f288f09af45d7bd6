"""Masked-LM pre-training of a small BERT with accelerate, grad accumulation and bf16.

Modelled on: huggingface/transformers
``examples/pytorch/language-modeling/run_mlm_no_trainer.py``: tokenize, ``group_texts``
into ``block_size`` chunks, ``DataCollatorForLanguageModeling(mlm_probability=0.15)``,
AdamW with a no-decay group for bias/LayerNorm, ``get_scheduler`` sized with
``ceil(len(train_dataloader) / gradient_accumulation_steps)`` update steps per epoch,
``accelerator.accumulate(model)``, ``accelerator.clip_grad_norm_`` under
``if accelerator.sync_gradients``, perplexity from ``gather_for_metrics`` losses at the
end of each epoch. The tokenizer is a ``BertTokenizerFast`` built from a vocab file of
a synthetic toy language; the model is built from a small ``BertConfig``.

What is unusual about the loop (all intentional):
  * ``optimizer.step()``, ``lr_scheduler.step()`` and ``optimizer.zero_grad()`` are
    called on *every* micro-batch, but inside ``accelerator.accumulate`` they are
    no-ops except on every 2nd one (the accelerate idiom), so parameters only change
    every 2 forward/backward passes and gradients accumulate in between;
  * the masking is random per batch (the collator re-masks every time), so train
    loss is noisy even on repeated data;
  * bf16 autocast on CPU (``mixed_precision="bf16"``, entered explicitly with
    ``accelerator.autocast()`` around the forward) with fp32 master weights.
"""
import math
import os
import random
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    DataCollatorForLanguageModeling,
    get_scheduler,
)

torch.set_num_threads(1)

BLOCK_SIZE = 32
GRAD_ACCUM = 2
EPOCHS = 4
BATCH = 8
EVAL_BATCH = 32

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "our robot", "the bird"]
VERBS = ["sees", "likes", "finds", "paints", "follows", "feeds"]
OBJECTS = ["the ball", "a tree", "the river", "an apple", "the house", "a book"]
ADVERBS = ["today", "quietly", "again", "at night", "every day", "slowly"]


def synthetic_corpus(n, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        s, v, o, a = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS),
                      rng.choice(ADVERBS))
        lines.append(f"{s} {v} {o} {a} .")
    return lines


def build_tokenizer(tmp):
    words = sorted({w for phrase in SUBJECTS + VERBS + OBJECTS + ADVERBS for w in phrase.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + words
    path = os.path.join(tmp, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    return BertTokenizerFast(vocab_file=path, do_lower_case=True)


def group_texts(tokenized, block_size):
    concatenated = {k: sum(tokenized[k], []) for k in tokenized}
    total = (len(concatenated["input_ids"]) // block_size) * block_size
    return [{k: v[i:i + block_size] for k, v in concatenated.items()}
            for i in range(0, total, block_size)]


def main():
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM, mixed_precision="bf16",
                              cpu=True)
    set_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(tmp)
        tok_kwargs = dict(return_special_tokens_mask=True)
        train_blocks = group_texts(tokenizer(synthetic_corpus(900, 1), **tok_kwargs), BLOCK_SIZE)
        eval_blocks = group_texts(tokenizer(synthetic_corpus(200, 2), **tok_kwargs), BLOCK_SIZE)

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=256,
                        max_position_embeddings=BLOCK_SIZE)
    model = BertForMaskedLM(config)

    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)
    train_dataloader = DataLoader(train_blocks, shuffle=True, collate_fn=collator,
                                  batch_size=BATCH)
    eval_dataloader = DataLoader(eval_blocks, collate_fn=collator, batch_size=EVAL_BATCH)

    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters()
                    if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters()
                    if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=5e-3)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / GRAD_ACCUM)
    max_train_steps = EPOCHS * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer,
                                 num_warmup_steps=4 * accelerator.num_processes,
                                 num_training_steps=max_train_steps * accelerator.num_processes)

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    accelerator.print(f"micro-batches/epoch {len(train_dataloader)}, "
                      f"optimizer updates total {max_train_steps}")
    completed_steps = 0
    for epoch in range(EPOCHS):
        model.train()
        total_loss = 0.0
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                with accelerator.autocast():  # bf16 autocast on CPU
                    outputs = model(**batch)
                loss = outputs.loss
                total_loss += loss.detach().float()
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                if completed_steps % 10 == 0:
                    accelerator.print(f"update {completed_steps:3d} loss {loss.item():.4f} "
                                      f"lr {lr_scheduler.get_last_lr()[0]:.2e}")
            if completed_steps >= max_train_steps:
                break

        model.eval()
        losses = []
        for batch in eval_dataloader:
            with torch.no_grad(), accelerator.autocast():
                outputs = model(**batch)
            losses.append(accelerator.gather_for_metrics(outputs.loss.repeat(EVAL_BATCH)))
        eval_loss = torch.mean(torch.cat(losses))
        perplexity = math.exp(eval_loss)
        accelerator.print(f"epoch {epoch}: perplexity {perplexity:.2f} eval_loss {eval_loss:.4f} "
                          f"train_loss {total_loss.item() / len(train_dataloader):.4f}")


if __name__ == "__main__":
    main()
