"""Modelled on huggingface/transformers examples/pytorch/translation/run_translation.py
(Seq2SeqTrainer + Seq2SeqTrainingArguments, predict_with_generate, generation_max_length,
label padding with -100, compute_metrics on decoded generations).

Model: T5ForConditionalGeneration from a tiny T5Config (no from_pretrained, no tokenizer:
integer tokens stand in for sentencepiece ids).  Synthetic 'translation' task: the target is
the source sequence with every token mapped through a fixed word-for-word 'dictionary'
(a permutation of a small vocabulary).
Exercises linear warmup/decay scheduler, label smoothing, gradient accumulation,
max_grad_norm, periodic evaluation with generation, save_strategy with a checkpoint limit,
and a final trainer.predict()."""
import numpy as np
import torch
from transformers import (T5Config, T5ForConditionalGeneration, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments, set_seed)

set_seed(0)
PAD, EOS, V = 0, 1, 40
rng = np.random.default_rng(0)
lexicon = {a: int(b) for a, b in zip(range(3, V), rng.permutation(np.arange(3, V)))}

class ListDataset(torch.utils.data.Dataset):
    def __init__(self, rows): self.rows = rows
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]

def make(n):
    rows = []
    for _ in range(n):
        ln = int(rng.integers(3, 9))
        src = rng.integers(3, V, size=ln).tolist()
        tgt = [lexicon[t] for t in src]
        rows.append({"input_ids": src + [EOS], "labels": tgt + [EOS]})
    return ListDataset(rows)

train_ds, eval_ds, test_ds = make(384), make(64), make(32)

def data_collator(features):
    """what DataCollatorForSeq2Seq(model=model) does: pad inputs with pad id, labels with -100,
    and prepare decoder_input_ids (needed because label smoothing pops `labels`)"""
    mi = max(len(f["input_ids"]) for f in features)
    ml = max(len(f["labels"]) for f in features)
    ids = torch.full((len(features), mi), PAD, dtype=torch.long)
    lab = torch.full((len(features), ml), -100, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        lab[i, :len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": lab,
            "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=lab)}

config = T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                  num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
                  pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
model = T5ForConditionalGeneration(config)

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
    exact, tok_acc, n_tok = 0, 0, 0
    for p, l in zip(preds, labels):
        p, l = strip(p[1:] if p[0] == PAD else p), strip(l)   # drop decoder start token
        exact += int(p == l)
        tok_acc += sum(int(a == b) for a, b in zip(p, l)); n_tok += len(l)
    return {"exact_match": exact / len(labels), "token_acc": tok_acc / max(n_tok, 1)}

args = Seq2SeqTrainingArguments(
    output_dir="out/hf_t5_seq2seq", per_device_train_batch_size=16, per_device_eval_batch_size=32,
    gradient_accumulation_steps=2, learning_rate=3e-3, weight_decay=0.01, warmup_steps=5,
    lr_scheduler_type="linear", max_steps=48, label_smoothing_factor=0.1, max_grad_norm=1.0,
    eval_strategy="steps", eval_steps=16, save_strategy="steps", save_steps=16, save_total_limit=1,
    logging_steps=6, disable_tqdm=True, predict_with_generate=True, generation_max_length=12, generation_num_beams=1,
    report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0)

trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                         data_collator=data_collator, compute_metrics=compute_metrics)
train_result = trainer.train()
print("train metrics:", train_result.metrics)
metrics = trainer.evaluate(max_length=12, num_beams=1, metric_key_prefix="eval")
print("eval metrics:", metrics)
predict_results = trainer.predict(test_ds, metric_key_prefix="predict", max_length=12, num_beams=2)
print("predict metrics:", predict_results.metrics)
