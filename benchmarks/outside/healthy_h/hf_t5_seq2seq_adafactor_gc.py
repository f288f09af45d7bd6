"""Tiny T5 (built from T5Config) trained with Seq2SeqTrainer on a digit shift-cipher task, using
Adafactor, gradient checkpointing, label smoothing and generate()-based evaluation mid-run.

Modelled on: transformers examples/pytorch/summarization/run_summarization.py
(Seq2SeqTrainer, DataCollatorForSeq2Seq-style padding with label_pad_token_id=-100,
predict_with_generate, compute_metrics on decoded predictions) with the T5 fine-tuning settings
recommended in the transformers Adafactor documentation (Adafactor, relative_step=False,
scale_parameter=False, constant schedule with warm-up).

Unusual but intended:
  * gradient checkpointing (use_reentrant=False): every block's forward is recomputed during
    backward, so forward hooks/activations are seen twice per step, and use_cache is off in
    training while generate() turns the KV cache back on for evaluation;
  * Adafactor keeps factored (row/column) second-moment statistics instead of a full Adam state;
  * label smoothing (0.1) means the training loss cannot go to zero even at perfect accuracy;
  * evaluation with autoregressive generation happens every 20 steps, inside the epoch.
"""
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration,
                          set_seed)

torch.set_num_threads(1)
PAD, EOS, DIGIT0 = 0, 1, 2          # tokens 2..11 are the digits 0..9
VOCAB = 16


class ShiftCipherDataset(Dataset):
    """source: digits d_1..d_L, target: (d_i + 1) mod 10 for each digit."""

    def __init__(self, n, seed, min_len=2, max_len=4):
        g = torch.Generator().manual_seed(seed)
        self.examples = []
        for _ in range(n):
            L = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
            digits = (torch.randint(0, 10, (L,), generator=g) + DIGIT0).tolist()
            self.examples.append((digits + [EOS], [DIGIT0 + (d - DIGIT0 + 1) % 10 for d in digits] + [EOS]))

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        src, tgt = self.examples[i]
        return {"input_ids": src, "labels": tgt}


def make_collator(model, label_pad_token_id=-100):
    """Pads like DataCollatorForSeq2Seq(model=model); decoder_input_ids are needed because with
    label smoothing the Trainer pops `labels` before calling the model."""
    def collate(features):
        batch = pad_batch(features, label_pad_token_id)
        batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        return batch
    return collate


def pad_batch(features, label_pad_token_id=-100):
    max_src = max(len(f["input_ids"]) for f in features)
    max_tgt = max(len(f["labels"]) for f in features)
    ids = torch.full((len(features), max_src), PAD)
    mask = torch.zeros((len(features), max_src), dtype=torch.long)
    labels = torch.full((len(features), max_tgt), label_pad_token_id)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, :len(f["input_ids"])] = 1
        labels[i, :len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def strip(seq):
    out = []
    for t in seq:
        if t == EOS:
            break
        if t >= DIGIT0:
            out.append(int(t) - DIGIT0)
    return out


def compute_metrics(eval_pred):
    preds, labels = eval_pred
    preds = preds[0] if isinstance(preds, tuple) else preds
    labels = np.where(labels == -100, PAD, labels)
    exact = [strip(p) == strip(l) for p, l in zip(preds, labels)]
    return {"exact_match": float(np.mean(exact))}


def main():
    set_seed(0)
    cfg = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                   num_heads=4, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                   feed_forward_proj="relu")
    model = T5ForConditionalGeneration(cfg)
    model.generation_config.max_new_tokens = 10
    with tempfile.TemporaryDirectory() as out:
        args = Seq2SeqTrainingArguments(
            output_dir=out, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
            per_device_train_batch_size=64, per_device_eval_batch_size=128, max_steps=60,
            optim="adafactor", learning_rate=5e-3, lr_scheduler_type="constant_with_warmup", warmup_steps=5,
            label_smoothing_factor=0.1, gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            eval_strategy="steps", eval_steps=20, logging_steps=5, predict_with_generate=True,
            remove_unused_columns=False,
        )
        trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=ShiftCipherDataset(2000, 1),
                                 eval_dataset=ShiftCipherDataset(200, 2), data_collator=make_collator(model),
                                 compute_metrics=compute_metrics)
        trainer.train()
        sample = pad_batch([ShiftCipherDataset(1, 3)[0]])
        model.eval()
        gen = model.generate(input_ids=sample["input_ids"], attention_mask=sample["attention_mask"])
        print("input", strip(sample["input_ids"][0].tolist()), "->", strip(gen[0].tolist()))


if __name__ == "__main__":
    main()
