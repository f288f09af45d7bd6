"""A tiny GPT-2 language model trained with the Hugging Face Trainer, preempted twice and resumed from its checkpoints.

Modelled on: the transformers Trainer documentation for checkpoints and ``resume_from_checkpoint``
(https://huggingface.co/docs/transformers/main/en/trainer#checkpoints, examples/pytorch/language-modeling/run_clm.py)
Habits reproduced: ``GPT2LMHeadModel(GPT2Config(...))`` from scratch on fixed-length token blocks whose
``labels`` are a copy of ``input_ids``; ``TrainingArguments`` with ``max_steps``, ``save_strategy="steps"``,
``save_steps``, a cosine schedule with warm-up, ``logging_steps=1``, ``report_to=[]`` and ``use_cpu=True``;
``Trainer(model=..., args=..., train_dataset=..., eval_dataset=..., data_collator=default_data_collator)``;
a ``TrainerCallback`` whose ``on_step_end`` sets ``control.should_training_stop`` at the preemption step,
which falls on a ``save_steps`` boundary so ``checkpoint-<step>`` is written first; then, as after a restart,
a fresh model and a fresh Trainer and ``trainer.train(resume_from_checkpoint=<that checkpoint>)``, which
restores weights, optimizer, scheduler, RNG and ``global_step`` and skips the batches already seen;
``trainer.evaluate()`` at the end with perplexity ``math.exp(eval_loss)``.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments,
                          default_data_collator)


class ArithmeticSequences(Dataset):
    """Blocks of tokens ``(start + stride * t) % vocab_size``: predictable after the first two tokens."""

    def __init__(self, n, block_size, vocab_size, seed):
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab_size, (n, 1), generator=generator)
        stride = torch.randint(1, 4, (n, 1), generator=generator)
        self.input_ids = (start + stride * torch.arange(block_size)) % vocab_size

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, idx):
        return {"input_ids": self.input_ids[idx], "labels": self.input_ids[idx].clone()}


class PreemptionCallback(TrainerCallback):
    """Stops the run at ``stop_step``, the way the scheduler kills a job; the checkpoint there is saved first."""

    def __init__(self, stop_step):
        self.stop_step = stop_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.stop_step:
            control.should_training_stop = True
        return control


def resume_points(total_steps):
    """Steps after which the job is preempted and restarted from its checkpoint."""
    k = total_steps // 3
    return [k, 2 * k] if k else []


def make_training_args(args, output_dir):
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=32,
        learning_rate=args.learning_rate,
        weight_decay=0.01,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        save_strategy="steps",
        save_steps=max(1, args.steps // 3),
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=args.seed,
    )


def main():
    parser = argparse.ArgumentParser(description="Trainer resume_from_checkpoint after two preemptions")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps in total, across the resumes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    train_dataset = ArithmeticSequences(args.batch_size * 5, config.n_positions, config.vocab_size, args.seed)
    eval_dataset = ArithmeticSequences(32, config.n_positions, config.vocab_size, args.seed + 1)

    with tempfile.TemporaryDirectory() as output_dir:
        checkpoint = None
        for stop_step in resume_points(args.steps) + [args.steps]:
            # A restarted job: a fresh, randomly initialised model and a fresh Trainer.
            model = GPT2LMHeadModel(config)
            trainer = Trainer(
                model=model,
                args=make_training_args(args, output_dir),
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                data_collator=default_data_collator,
                callbacks=[PreemptionCallback(stop_step)],
            )
            trainer.train(resume_from_checkpoint=checkpoint)
            if trainer.state.global_step < args.steps:
                checkpoint = os.path.join(output_dir, f"checkpoint-{trainer.state.global_step}")
                print(f"preempted at step {trainer.state.global_step}; resuming from {os.path.basename(checkpoint)}")

        metrics = trainer.evaluate()
        print(f"finished at step {trainer.state.global_step}: eval_loss {metrics['eval_loss']:.4f} "
              f"perplexity {math.exp(metrics['eval_loss']):.2f}")


if __name__ == "__main__":
    main()
