"""Sequence-to-sequence "translation" with a tiny T5 and the Hugging Face ``Seq2SeqTrainer``.

Modelled on ``transformers/examples/pytorch/translation/run_translation.py``
(and the HF course chapter 7 "Translation"): a ``T5ForConditionalGeneration``
trained with ``Seq2SeqTrainingArguments``/``Seq2SeqTrainer``, labels padded with
-100 so padding is ignored by the loss, a collator that builds
``decoder_input_ids`` from the labels (as ``DataCollatorForSeq2Seq`` does), label
smoothing, a linear schedule with
warm-up, ``predict_with_generate=True`` so evaluation decodes with
``model.generate`` and ``compute_metrics`` reports exact-match and token
accuracy (in place of sacreBLEU), evaluation every ``eval_steps``.

The model is built from a small ``T5Config`` (no pretrained weights, no
tokenizer).  The synthetic language pair: the source is a random sequence of
"words", the target is the word-by-word translation through a fixed random
dictionary, so an encoder-decoder has to learn alignment and the mapping.
``max_steps=80``.
"""
import argparse
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration,
                          default_data_collator, set_seed)

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
set_seed(3)

PAD, EOS, FIRST_WORD, VOCAB = 0, 1, 2, 24
MAX_SRC, MAX_TGT = 8, 8
DICTIONARY = np.random.default_rng(99).permutation(np.arange(FIRST_WORD, VOCAB))


class TranslationPairs(Dataset):
    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.items = []
        for _ in range(n):
            length = int(rng.integers(3, MAX_SRC))  # + EOS fits in MAX_SRC
            src = rng.integers(FIRST_WORD, VOCAB, size=length)
            tgt = DICTIONARY[src - FIRST_WORD]
            input_ids = np.full(MAX_SRC, PAD)
            input_ids[:length] = src
            input_ids[length] = EOS
            labels = np.full(MAX_TGT, -100)  # -100 = ignored by the loss
            labels[:length] = tgt
            labels[length] = EOS
            self.items.append({
                "input_ids": torch.tensor(input_ids, dtype=torch.long),
                "attention_mask": torch.tensor(input_ids != PAD, dtype=torch.long),
                "labels": torch.tensor(labels, dtype=torch.long),
            })

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def strip(seq):
    out = []
    for t in seq:
        if t == EOS:
            break
        if t not in (PAD, -100):
            out.append(int(t))
    return out


def compute_metrics(eval_preds):
    preds, labels = eval_preds
    if isinstance(preds, tuple):
        preds = preds[0]
    exact, correct, total = 0, 0, 0
    for p, l in zip(preds, labels):
        p = strip(p[1:] if p[0] == PAD else p)  # drop decoder start token
        l = strip(l)
        exact += int(p == l)
        correct += sum(int(a == b) for a, b in zip(p, l))
        total += len(l)
    return {"exact_match": exact / len(labels), "token_acc": correct / max(total, 1)}


config = T5Config(
    vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
    dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
    relative_attention_num_buckets=8, relative_attention_max_distance=16,
)
model = T5ForConditionalGeneration(config)
model.generation_config.max_length = MAX_TGT + 1



def data_collator(features):
    # like DataCollatorForSeq2Seq(model=model): with label smoothing the Trainer pops
    # "labels" before the forward pass, so the decoder inputs must be built here.
    batch = default_data_collator(features)
    batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    return batch


train_dataset = TranslationPairs(1280, seed=1)
eval_dataset = TranslationPairs(128, seed=2)

with tempfile.TemporaryDirectory() as output_dir:
    training_args = Seq2SeqTrainingArguments(
        output_dir=output_dir,
        max_steps=80,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        learning_rate=3e-3,
        warmup_steps=8,
        lr_scheduler_type="linear",
        weight_decay=0.01,
        label_smoothing_factor=0.1,
        eval_strategy="steps",
        eval_steps=40,
        logging_steps=10,
        save_strategy="no",
        predict_with_generate=True,
        generation_max_length=MAX_TGT + 1,
        generation_num_beams=1,
        report_to=[],
        use_cpu=True,
        seed=3,
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=data_collator,
        compute_metrics=compute_metrics,
    )
    print("before training:", {k: round(v, 4) for k, v in trainer.evaluate().items() if "runtime" not in k and "per_second" not in k})
    trainer.train()
    losses = [round(log["loss"], 4) for log in trainer.state.log_history if "loss" in log]
    print("training losses:", losses)
    final = trainer.evaluate()
    print("after training:", {k: round(v, 4) for k, v in final.items() if "runtime" not in k and "per_second" not in k})
