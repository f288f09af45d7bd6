"""Seq2SeqTrainer fine-tuning of a tiny T5 with Adafactor in relative-step mode.

Modelled on the Hugging Face recipe for T5 with Adafactor (the transformers
``Adafactor`` docstring / "T5 finetuning tips" forum thread): build
``Adafactor(params, scale_parameter=True, relative_step=True, warmup_init=False, lr=None)``
and hand it to the Trainer together with ``AdafactorSchedule(optimizer)`` through
``optimizers=(optimizer, scheduler)``.  The model is a T5ForConditionalGeneration
built from a small config (no weights); the task maps a digit string to its
reversal with a task prefix token, labels padded with -100.

Unusual about the loop: no learning rate is given anywhere; Adafactor derives the
step size from the step count (``min(1e-2, 1/sqrt(step))``) scaled by each
parameter's RMS, keeps factored second moments for matrices, and the scheduler
is only a proxy that reports that internal rate to the Trainer.  70 steps.
"""
import os
import random
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor, AdafactorSchedule
from transformers.utils import logging as hf_logging

PAD, EOS, PREFIX, DIGIT0 = 0, 1, 2, 3  # tokens 3..12 are digits


class ReverseDataset(Dataset):
    def __init__(self, n, seed):
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            digits = [rng.randrange(10) for _ in range(rng.randint(3, 6))]
            src = [PREFIX] + [DIGIT0 + d for d in digits] + [EOS]
            tgt = [DIGIT0 + d for d in reversed(digits)] + [EOS]
            self.items.append((src, tgt))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    ls = max(len(s) for s, _ in batch)
    lt = max(len(t) for _, t in batch)
    ids = torch.full((len(batch), ls), PAD)
    mask = torch.zeros(len(batch), ls, dtype=torch.long)
    labels = torch.full((len(batch), lt), -100)
    for i, (s, t) in enumerate(batch):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        labels[i, :len(t)] = torch.tensor(t)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hf_logging.set_verbosity_error()
    config = T5Config(vocab_size=16, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=16, dropout_rate=0.0,
                      pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
    model = T5ForConditionalGeneration(config)
    optimizer = Adafactor(model.parameters(), scale_parameter=True, relative_step=True,
                          warmup_init=False, lr=None)
    scheduler = AdafactorSchedule(optimizer)

    with tempfile.TemporaryDirectory() as tmp:
        args = Seq2SeqTrainingArguments(
            output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=32,
            per_device_eval_batch_size=64, max_steps=70, logging_steps=10, eval_strategy="steps",
            eval_steps=35, save_strategy="no", report_to=[], use_cpu=True, seed=0,
            disable_tqdm=True, remove_unused_columns=False)
        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=ReverseDataset(2240, 1),
                                 eval_dataset=ReverseDataset(128, 2), data_collator=collate,
                                 optimizers=(optimizer, scheduler))
        trainer.train()

    for rec in trainer.state.log_history:
        if "loss" in rec:
            print(f"step {rec['step']:3d} loss {rec['loss']:.4f} lr {rec['learning_rate']:.5f}")
        elif "eval_loss" in rec:
            print(f"step {rec['step']:3d} eval_loss {rec['eval_loss']:.4f}")
    model.eval()
    batch = collate([ReverseDataset(4, 3)[i] for i in range(4)])
    with torch.no_grad():
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12)
    exact = sum(int(torch.equal(o[1:1 + (l != -100).sum()], l[l != -100])) for o, l in zip(out, batch["labels"]))
    print(f"greedy exact matches on 4 samples: {exact}")


if __name__ == "__main__":
    main()
