"""Modelled on huggingface/transformers examples/pytorch/text-classification/run_glue.py
(Trainer + TrainingArguments, eval_strategy="steps", load_best_model_at_end,
metric_for_best_model, EarlyStoppingCallback). Model built from a tiny BertConfig; synthetic
'sentiment' task where the label is determined by token presence."""
import numpy as np, torch

class Dataset(torch.utils.data.Dataset):
    """column dict -> list of row dicts (no `datasets` package here)"""
    def __init__(self, cols): self.rows = [dict(zip(cols, v)) for v in zip(*cols.values())]
    @classmethod
    def from_dict(cls, cols): return cls(cols)
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainingArguments,
                          EarlyStoppingCallback, set_seed)

set_seed(0)
V, L = 200, 24
rng = np.random.default_rng(0)
def make(n):
    ids, labels = [], []
    for _ in range(n):
        ln = int(rng.integers(8, L))
        x = rng.integers(5, V, size=ln).tolist()
        y = int(rng.integers(0, 2))
        x[int(rng.integers(1, ln))] = 3 if y else 4    # marker token
        ids.append([2] + x); labels.append(y)
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1]*len(i) for i in ids], "label": labels})
train, val = make(256), make(64)

cfg = BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=64, num_labels=2)
model = BertForSequenceClassification(cfg)

def collate(feats):
    m = max(len(f["input_ids"]) for f in feats)
    ids = torch.zeros(len(feats), m, dtype=torch.long); am = torch.zeros_like(ids)
    for i, f in enumerate(feats):
        ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"]); am[i, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": am, "labels": torch.tensor([f["label"] for f in feats])}

def compute_metrics(p):
    preds = np.argmax(p.predictions, axis=-1)
    return {"accuracy": float((preds == p.label_ids).mean())}

args = TrainingArguments(output_dir="out/hf_bert_cls", per_device_train_batch_size=16,
    per_device_eval_batch_size=32, learning_rate=5e-4, weight_decay=0.01, warmup_ratio=0.1,
    num_train_epochs=3, eval_strategy="steps", eval_steps=10, save_strategy="steps", save_steps=10,
    save_total_limit=2, load_best_model_at_end=True, metric_for_best_model="accuracy",
    logging_steps=5, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, data_collator=collate,
                  compute_metrics=compute_metrics,
                  callbacks=[EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=0.0)])
trainer.train()
print(trainer.evaluate())
