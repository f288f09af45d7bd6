"""Modelled on huggingface/transformers examples/pytorch/translation/run_translation.py
(Seq2SeqTrainer, Seq2SeqTrainingArguments(predict_with_generate=True),
DataCollatorForSeq2Seq with label_pad_token_id=-100, compute_metrics on generated ids).
T5 built from a tiny T5Config; synthetic task: reverse the source sequence."""
import numpy as np, torch

class Dataset(torch.utils.data.Dataset):
    """column dict -> list of row dicts (no `datasets` package here)"""
    def __init__(self, cols): self.rows = [dict(zip(cols, v)) for v in zip(*cols.values())]
    @classmethod
    def from_dict(cls, cols): return cls(cols)
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]
from transformers import (T5Config, T5ForConditionalGeneration, Seq2SeqTrainer, Seq2SeqTrainingArguments,
                          DataCollatorForSeq2Seq, set_seed)
set_seed(0)
V = 64; PAD, EOS = 0, 1
rng = np.random.default_rng(0)
def make(n):
    src, tgt = [], []
    for _ in range(n):
        s = rng.integers(3, V, size=int(rng.integers(4, 10))).tolist()
        src.append(s + [EOS]); tgt.append(s[::-1] + [EOS])
    return Dataset.from_dict({"input_ids": src, "attention_mask": [[1]*len(s) for s in src], "labels": tgt})
train, val = make(320), make(48)
cfg = T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
               decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS, dropout_rate=0.1)
model = T5ForConditionalGeneration(cfg)

class Tok:  # minimal stand-in the collator needs for padding
    pad_token_id = PAD; padding_side = "right"
    def pad(self, feats, padding=True, max_length=None, pad_to_multiple_of=None, return_tensors="pt"):
        m = max(len(f["input_ids"]) for f in feats)
        ids = torch.full((len(feats), m), PAD); am = torch.zeros_like(ids)
        out = {}
        for i, f in enumerate(feats):
            ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"]); am[i, :len(f["input_ids"])] = 1
        out["input_ids"], out["attention_mask"] = ids, am
        if "labels" in feats[0]:
            out["labels"] = torch.tensor([f["labels"] for f in feats])
        return out
collator = DataCollatorForSeq2Seq(Tok(), model=model, label_pad_token_id=-100)

def compute_metrics(ev):
    preds, labels = ev
    preds = np.where(preds < 0, PAD, preds)
    labels = np.where(labels == -100, PAD, labels)
    exact = [list(p[p > 1][:len(l[l > 1])]) == list(l[l > 1]) for p, l in zip(preds, labels)]
    return {"exact_match": float(np.mean(exact))}

args = Seq2SeqTrainingArguments(output_dir="out/hf_t5", per_device_train_batch_size=16,
    per_device_eval_batch_size=16, learning_rate=3e-3, lr_scheduler_type="linear", num_train_epochs=2,
    eval_strategy="steps", eval_steps=15, save_strategy="no", logging_steps=5, predict_with_generate=True,
    generation_max_length=12, generation_num_beams=1, label_smoothing_factor=0.1, report_to=[], use_cpu=True, seed=0)
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train, eval_dataset=val, data_collator=collator,
                         compute_metrics=compute_metrics)
trainer.train()
print(trainer.evaluate(max_length=12, num_beams=2))
