"""Sentence-pair classification fine-tuning with Hugging Face Accelerate and gradient accumulation.

Modelled on: huggingface/accelerate examples/nlp_example.py and
examples/by_feature/gradient_accumulation.py (BERT on GLUE MRPC).  Habits reproduced: a
``training_function(config, args)`` taking a config dict, ``Accelerator(cpu=True,
gradient_accumulation_steps=...)``, ``set_seed``, the model built before the optimizer
and everything passed through ``accelerator.prepare`` in one call, ``with
accelerator.accumulate(model):`` around forward/backward/step/zero_grad (the scheduler
stepped inside it too), ``accelerator.backward(loss)``, an evaluation after each epoch in
``model.eval()`` under ``torch.no_grad()`` with predictions and references gathered by
``accelerator.gather_for_metrics``, accuracy/F1 computed by hand, and
``accelerator.print`` on the main process.

``--steps`` counts optimizer updates: with accumulation over 2 micro-batches the loop
reads ``2 * steps`` batches.
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.optim import AdamW
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

MAX_LEN = 20
VOCAB = 120


class ParaphrasePairs(Dataset):
    """Fake MRPC: the pair is a paraphrase when the second sentence is a shuffle of the first."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            a = torch.randint(4, VOCAB, (8,), generator=g)
            label = int(torch.randint(0, 2, (1,), generator=g))
            b = a[torch.randperm(8, generator=g)] if label else torch.randint(4, VOCAB, (8,), generator=g)
            length = int(torch.randint(6, 9, (1,), generator=g))
            self.rows.append((a[:length], b[:length], label))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, idx):
        return self.rows[idx]


def pad_collate(rows):
    """Tokenizer-style padding to the longest pair of the batch (what DataCollatorWithPadding does)."""
    input_ids, token_type_ids, labels = [], [], []
    for a, b, label in rows:
        ids = [1] + a.tolist() + [2] + b.tolist() + [2]
        input_ids.append(ids)
        token_type_ids.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
        labels.append(label)
    longest = max(len(ids) for ids in input_ids)
    batch = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for ids, types in zip(input_ids, token_type_ids):
        pad = longest - len(ids)
        batch["input_ids"].append(ids + [0] * pad)
        batch["token_type_ids"].append(types + [0] * pad)
        batch["attention_mask"].append([1] * len(ids) + [0] * pad)
    batch = {k: torch.tensor(v) for k, v in batch.items()}
    batch["labels"] = torch.tensor(labels)
    return batch


def get_dataloaders(batch_size, seed):
    train_dataloader = DataLoader(ParaphrasePairs(96, seed), shuffle=True, collate_fn=pad_collate, batch_size=batch_size)
    eval_dataloader = DataLoader(ParaphrasePairs(40, seed + 1), shuffle=False, collate_fn=pad_collate, batch_size=16)
    return train_dataloader, eval_dataloader


def training_function(config, args):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    lr = config["lr"]
    batch_size = int(config["batch_size"])
    seed = int(config["seed"])

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(batch_size, seed)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=MAX_LEN + 4, num_labels=2,
    ))
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)

    max_updates = args.steps
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=1,
        # prepare() wraps the scheduler so that it only advances on real updates
        num_training_steps=max_updates,
    )

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    updates = 0
    epoch = 0
    while updates < max_updates:
        model.train()
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                updates += 1
                if updates >= max_updates:
                    break

        model.eval()
        tp = fp = fn = correct = total = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            correct += (predictions == references).sum().item()
            total += references.numel()
            tp += ((predictions == 1) & (references == 1)).sum().item()
            fp += ((predictions == 1) & (references == 0)).sum().item()
            fn += ((predictions == 0) & (references == 1)).sum().item()
        f1 = 2 * tp / max(2 * tp + fp + fn, 1)
        accelerator.print(f"epoch {epoch}: updates {updates} accuracy {correct / total:.3f} f1 {f1:.3f}")
        epoch += 1
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--steps", type=int, default=24, help="optimizer updates")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    args = parser.parse_args()
    config = {"lr": 2e-3, "seed": args.seed, "batch_size": 8}
    training_function(config, args)


if __name__ == "__main__":
    main()
