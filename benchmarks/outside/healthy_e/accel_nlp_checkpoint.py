"""Sentence-pair classification with 🤗 Accelerate, with ``save_state``/``load_state`` resume mid-run.

Modelled on accelerate's ``examples/by_feature/checkpointing.py`` (built on
``examples/nlp_example.py``, BERT on GLUE/MRPC): a sequence-classification
model, AdamW with ``get_linear_schedule_with_warmup`` sized by
``len(train_dataloader) * num_epochs``, ``accelerator.prepare`` of model,
optimizer, dataloaders and scheduler, ``accelerator.backward``, evaluation in
``model.eval()``/``torch.no_grad()`` with ``accelerator.gather_for_metrics``,
and ``accelerator.save_state`` at the end of every epoch.

To exercise the resume path the way a restarted job would, the run stops after
epoch 2, frees the prepared objects (``accelerator.free_memory``), builds a new
model/optimizer/scheduler/dataloaders, prepares them and calls
``accelerator.load_state`` (model, optimizer, scheduler and RNG states) before
continuing from epoch 2.  A tiny ``BertForSequenceClassification`` is built from
``BertConfig`` (no downloads) and the MRPC-like data are synthetic sentence
pairs on one of 4 "topics" (disjoint vocabulary slices): label 1 when sentence
B restates A, 0 when B contradicts it by containing a "negation" word.  4 epochs
x 20 steps = 80 optimizer steps.
"""
import argparse
import os
import tempfile

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)

CLS, SEP, PAD, MAX_LEN = 1, 2, 0, 24
NEGATIONS = [3, 4, 5]
FIRST_WORD, N_TOPICS, TOPIC_SIZE = 6, 4, 16
VOCAB = FIRST_WORD + N_TOPICS * TOPIC_SIZE
config = {"lr": 2e-3, "num_epochs": 4, "seed": 42, "batch_size": 16}


class PairDataset(Dataset):
    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.items = []
        for _ in range(n):
            # A and B share a topic; B either restates A (label 1) or contradicts it by
            # containing one of a few "negation" words (label 0).
            topic = int(rng.integers(0, N_TOPICS))
            label = int(rng.integers(0, 2))
            la, lb = int(rng.integers(5, 11)), int(rng.integers(5, 11))
            a = FIRST_WORD + topic * TOPIC_SIZE + rng.integers(0, TOPIC_SIZE, size=la)
            b = FIRST_WORD + topic * TOPIC_SIZE + rng.integers(0, TOPIC_SIZE, size=lb)
            if not label:
                b[rng.integers(0, lb)] = rng.choice(NEGATIONS)
            ids = [CLS, *a.tolist(), SEP, *b.tolist(), SEP]
            types = [0] * (la + 2) + [1] * (len(b) + 1)
            pad = MAX_LEN - len(ids)
            self.items.append({
                "input_ids": torch.tensor(ids + [PAD] * pad),
                "token_type_ids": torch.tensor(types + [0] * pad),
                "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                "labels": torch.tensor(label),
            })

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def get_dataloaders(batch_size):
    train_dataloader = DataLoader(PairDataset(320, seed=1), shuffle=True, batch_size=batch_size, drop_last=True)
    eval_dataloader = DataLoader(PairDataset(256, seed=2), shuffle=False, batch_size=64)
    return train_dataloader, eval_dataloader


def build(accelerator):
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=MAX_LEN, type_vocab_size=2, num_labels=2, pad_token_id=PAD))
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"], weight_decay=0.01)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=6, num_training_steps=len(train_dataloader) * config["num_epochs"])
    return accelerator.prepare(model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)


def train_epoch(accelerator, model, optimizer, train_dataloader, lr_scheduler):
    model.train()
    total, n = 0.0, 0
    for batch in train_dataloader:
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        total += loss.item()
        n += 1
    return total / n


def evaluate(accelerator, model, eval_dataloader):
    model.eval()
    correct, count, loss_sum = 0, 0, 0.0
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        predictions = outputs.logits.argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        correct += (predictions == references).sum().item()
        count += references.numel()
        loss_sum += outputs.loss.item() * references.numel()
    return correct / count, loss_sum / count


def main():
    accelerator = Accelerator(cpu=True)
    set_seed(config["seed"])
    ckpt_root = tempfile.TemporaryDirectory()
    stop_after = 2  # simulate the job being interrupted after this many epochs

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = build(accelerator)
    acc, vloss = evaluate(accelerator, model, eval_dataloader)
    accelerator.print(f"before training: eval_loss {vloss:.4f} accuracy {acc:.3f}")
    for epoch in range(stop_after):
        train_loss = train_epoch(accelerator, model, optimizer, train_dataloader, lr_scheduler)
        acc, vloss = evaluate(accelerator, model, eval_dataloader)
        accelerator.print(f"epoch {epoch}: train_loss {train_loss:.4f} eval_loss {vloss:.4f} accuracy {acc:.3f} "
                          f"lr {lr_scheduler.get_last_lr()[0]:.2e}")
        accelerator.save_state(os.path.join(ckpt_root.name, f"epoch_{epoch}"))

    # ---- "restart": drop everything, rebuild, restore the latest state
    del model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    accelerator.free_memory()
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = build(accelerator)
    dirs = sorted(d for d in os.listdir(ckpt_root.name) if d.startswith("epoch_"))
    resume_path = os.path.join(ckpt_root.name, dirs[-1])
    accelerator.load_state(resume_path)
    starting_epoch = int(dirs[-1].replace("epoch_", "")) + 1
    acc, vloss = evaluate(accelerator, model, eval_dataloader)
    accelerator.print(f"resumed from {dirs[-1]}: eval_loss {vloss:.4f} accuracy {acc:.3f} "
                      f"lr {lr_scheduler.get_last_lr()[0]:.2e}")

    for epoch in range(starting_epoch, config["num_epochs"]):
        train_loss = train_epoch(accelerator, model, optimizer, train_dataloader, lr_scheduler)
        acc, vloss = evaluate(accelerator, model, eval_dataloader)
        accelerator.print(f"epoch {epoch}: train_loss {train_loss:.4f} eval_loss {vloss:.4f} accuracy {acc:.3f} "
                          f"lr {lr_scheduler.get_last_lr()[0]:.2e}")
        accelerator.save_state(os.path.join(ckpt_root.name, f"epoch_{epoch}"))
    accelerator.end_training()
    ckpt_root.cleanup()


if __name__ == "__main__":
    main()
