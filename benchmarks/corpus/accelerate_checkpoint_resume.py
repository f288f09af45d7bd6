"""A token-classifier trained with Accelerate that is preempted twice and resumed with ``load_state`` each time.

Modelled on: huggingface/accelerate examples/by_feature/checkpointing.py
(https://github.com/huggingface/accelerate/blob/main/examples/by_feature/checkpointing.py)
Habits reproduced: ``Accelerator(cpu=True)`` and ``set_seed`` before the data loaders and model are
built; model, AdamW, dataloaders and a ``get_linear_schedule_with_warmup`` scheduler all passed through
``accelerator.prepare``; ``outputs = model(**batch)``, ``accelerator.backward(outputs.loss)``,
``optimizer.step()``/``lr_scheduler.step()``/``optimizer.zero_grad()``; ``accelerator.save_state`` into a
``step_{overall_step}`` folder every ``checkpointing_steps``; after each preemption a fresh Accelerator and
fresh objects, ``accelerator.load_state(path)`` (model, optimizer, scheduler and RNG states), the step parsed
back from the folder name into ``starting_epoch``/``resume_step``, and
``accelerator.skip_first_batches(train_dataloader, resume_step)`` for the resumed epoch; a seedable sampler with
``set_epoch(epoch)`` so each epoch's shuffle is reproducible; per-epoch evaluation in ``model.eval()`` under
``torch.no_grad()`` with ``accelerator.gather_for_metrics``.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import get_linear_schedule_with_warmup


class SyntheticSentiment(Dataset):
    """Token sequences whose label decides which half of the vocabulary most tokens come from."""

    def __init__(self, n, seq_len, vocab_size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (n,), generator=generator)
        half = vocab_size // 2
        tokens = torch.randint(0, half, (n, seq_len), generator=generator)
        on_topic = torch.rand(n, seq_len, generator=generator) < 0.65
        self.input_ids = tokens + half * (on_topic == self.labels.bool().unsqueeze(1)).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return {"input_ids": self.input_ids[idx], "labels": self.labels[idx]}


class BagOfEmbeddingsClassifier(nn.Module):
    def __init__(self, vocab_size, hidden_size=32, num_labels=2, dropout=0.1):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden_size)
        self.classifier = nn.Sequential(
            nn.Linear(hidden_size, 2 * hidden_size), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(2 * hidden_size, num_labels))

    def forward(self, input_ids, labels=None):
        logits = self.classifier(self.embeddings(input_ids).mean(1))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


def resume_points(total_steps):
    """Steps after which the job is preempted and restarted from its checkpoint."""
    k = total_steps // 3
    return [k, 2 * k] if k else []


def get_dataloaders(args):
    train = SyntheticSentiment(args.batch_size * args.batches_per_epoch, 16, args.vocab_size, args.seed)
    evaluation = SyntheticSentiment(64, 16, args.vocab_size, args.seed + 1)
    # Explicit generators keep each iter()'s base-seed draw off the global RNG that dropout uses, so the RNG
    # state restored by load_state matches an uninterrupted run whether or not an evaluation came in between.
    train_dataloader = DataLoader(train, shuffle=True, batch_size=args.batch_size, drop_last=True,
                                  generator=torch.Generator().manual_seed(args.seed))
    eval_dataloader = DataLoader(evaluation, shuffle=False, batch_size=32,
                                 generator=torch.Generator().manual_seed(args.seed))
    return train_dataloader, eval_dataloader


def training_function(args, stop_step, checkpoint_root, resume_from_checkpoint=None):
    """One life of the job: start up, optionally resume, train until ``stop_step``."""
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(args.seed)
    train_dataloader, eval_dataloader = get_dataloaders(args)
    model = BagOfEmbeddingsClassifier(args.vocab_size)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=args.lr, weight_decay=0.01)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.steps)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    overall_step, starting_epoch, resume_step = 0, 0, 0
    if resume_from_checkpoint:
        accelerator.load_state(resume_from_checkpoint)
        overall_step = int(os.path.basename(resume_from_checkpoint).replace("step_", ""))
        starting_epoch, resume_step = divmod(overall_step, len(train_dataloader))
        accelerator.print(f"Resumed from checkpoint: step_{overall_step} (epoch {starting_epoch}, "
                          f"batch {resume_step}, lr {lr_scheduler.get_last_lr()[0]:.2e})")

    output_dir = None
    num_epochs = math.ceil(args.steps / len(train_dataloader))
    for epoch in range(starting_epoch, num_epochs):
        model.train()
        train_dataloader.set_epoch(epoch)
        if epoch == starting_epoch and resume_step:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            outputs = model(**batch)
            accelerator.backward(outputs.loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            if overall_step % args.checkpointing_steps == 0:
                output_dir = os.path.join(checkpoint_root, f"step_{overall_step}")
                accelerator.save_state(output_dir)
            if overall_step >= stop_step:
                break

        if overall_step % len(train_dataloader) == 0 or overall_step == args.steps:
            model.eval()
            correct, total = 0, 0
            for batch in eval_dataloader:
                with torch.no_grad():
                    outputs = model(**batch)
                predictions, references = accelerator.gather_for_metrics(
                    (outputs.logits.argmax(dim=-1), batch["labels"]))
                correct += (predictions == references).sum().item()
                total += references.numel()
            accelerator.print(f"epoch {epoch}: step {overall_step} loss {outputs.loss.item():.4f} "
                              f"accuracy {correct / total:.3f}")
        if overall_step >= stop_step:
            break
    accelerator.end_training()
    return overall_step, output_dir


def main():
    parser = argparse.ArgumentParser(description="Accelerate checkpointing with two preemptions")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps in total, across the resumes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches-per-epoch", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--warmup-steps", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    args.checkpointing_steps = max(1, args.steps // 3)

    with tempfile.TemporaryDirectory() as checkpoint_root:
        checkpoint = None
        for stop_step in resume_points(args.steps) + [args.steps]:
            step, checkpoint = training_function(args, stop_step, checkpoint_root, checkpoint)
            if step < args.steps:
                print(f"preempted after step {step}; latest checkpoint {os.path.basename(checkpoint)}")
    print(f"finished after {step} optimizer steps")


if __name__ == "__main__":
    main()
