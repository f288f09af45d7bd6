"""Training a small GPT-2 language model with a hand-written PyTorch loop over transformers.

Modelled on: the Hugging Face course/docs recipe "Training in native PyTorch"
(huggingface/transformers docs/source/en/training.md, section "Train in native PyTorch")
and examples/pytorch/language-modeling/run_clm_no_trainer.py.  Habits reproduced: a
``GPT2LMHeadModel`` from a ``GPT2Config``, batches as dicts moved with
``{k: v.to(device) for k, v in batch.items()}``, ``model(**batch).loss``, AdamW with a
no-decay group for biases and LayerNorm weights, ``get_scheduler("linear", ...)`` with
warm-up, ``lr_scheduler.step()`` then ``optimizer.zero_grad()`` each step, a per-epoch
evaluation computing perplexity with ``math.exp``, and ``save_pretrained`` followed by a
``from_pretrained`` reload from the local directory.
"""

import argparse
import math
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler

BLOCK = 16
VOCAB = 80


def make_blocks(n_blocks, seed):
    """Token blocks from a random 'language' in which each token has two likely successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 2), generator=torch.Generator().manual_seed(1234))
    blocks = torch.empty(n_blocks, BLOCK, dtype=torch.long)
    blocks[:, 0] = torch.randint(0, VOCAB, (n_blocks,), generator=g)
    for t in range(1, BLOCK):
        pick = torch.randint(0, 2, (n_blocks,), generator=g)
        blocks[:, t] = successors[blocks[:, t - 1], pick]
    return [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in blocks]


def collate(examples):
    return {key: torch.stack([ex[key] for ex in examples]) for key in examples[0]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40, help="total optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="non-reentrant activation checkpointing of every block (run_clm_no_trainer's flag)")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_dataset = make_blocks(48, args.seed)
    eval_dataset = make_blocks(16, args.seed + 1)
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=args.batch_size, collate_fn=collate)
    eval_dataloader = DataLoader(eval_dataset, batch_size=args.batch_size, collate_fn=collate)

    config = GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)

    no_decay = ["bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"]
    grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.1},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped_parameters, lr=args.lr)

    num_training_steps = args.steps
    num_epochs = math.ceil(num_training_steps / len(train_dataloader))
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=args.warmup,
                                 num_training_steps=num_training_steps)

    completed_steps = 0
    for epoch in range(num_epochs):
        model.train()
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()

            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1
            if completed_steps % 2 == 0:
                print(f"epoch {epoch} step {completed_steps} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e}")
            if completed_steps >= num_training_steps:
                break

        model.eval()
        losses = []
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(outputs.loss.repeat(batch["input_ids"].shape[0]))
        eval_loss = torch.cat(losses).mean()
        try:
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        print(f"epoch {epoch}: perplexity: {perplexity:.2f} eval_loss: {eval_loss.item():.4f}")

    with tempfile.TemporaryDirectory() as output_dir:
        model.save_pretrained(output_dir)
        reloaded = GPT2LMHeadModel.from_pretrained(output_dir)
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))
        print(f"saved to {output_dir}; reload identical: {same}")


if __name__ == "__main__":
    main()
