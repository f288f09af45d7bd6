"""Modelled on the HF Trainer docs 'Customize the Trainer' example (subclass overriding
compute_loss with a class-weighted CrossEntropyLoss) plus a TrainerCallback as in the
'Callbacks' docs (logs and stops on a loss target); RoBERTa from RobertaConfig, 3 imbalanced
classes; evaluation every N steps; eval_accumulation_steps."""
import numpy as np, torch

class Dataset(torch.utils.data.Dataset):
    """column dict -> list of row dicts (no `datasets` package here)"""
    def __init__(self, cols): self.rows = [dict(zip(cols, v)) for v in zip(*cols.values())]
    @classmethod
    def from_dict(cls, cols): return cls(cols)
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]
from transformers import (RobertaConfig, RobertaForSequenceClassification, Trainer, TrainingArguments,
                          TrainerCallback, set_seed)
set_seed(0)
V, L = 150, 20
rng = np.random.default_rng(0)
def make(n):
    ids, y = [], []
    for _ in range(n):
        c = int(rng.choice(3, p=[0.7, 0.2, 0.1]))
        x = rng.integers(10, V, size=L).tolist(); x[0] = 0
        for k in range(1, 4): x[int(rng.integers(1, L))] = 3 + c
        ids.append(x); y.append(c)
    return Dataset.from_dict({"input_ids": ids, "labels": y})
train, val = make(384), make(96)
cfg = RobertaConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    max_position_embeddings=L + 4, num_labels=3, pad_token_id=1, type_vocab_size=1)
model = RobertaForSequenceClassification(cfg)
class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = torch.nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.5, 3.0], device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss
class LossLogger(TrainerCallback):
    def __init__(self): self.hist = []
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs: self.hist.append((state.global_step, logs["loss"]))
    def on_evaluate(self, args, state, control, metrics=None, **kw):
        if metrics and metrics.get("eval_macro_acc", 0) > 0.99: control.should_training_stop = True
def compute_metrics(p):
    pr = p.predictions.argmax(-1)
    return {"macro_acc": float(np.mean([(pr[p.label_ids == c] == c).mean() for c in range(3)]))}
def collate(f):
    return {"input_ids": torch.tensor([x["input_ids"] for x in f]), "labels": torch.tensor([x["labels"] for x in f])}
args = TrainingArguments(output_dir="out/hf_roberta", per_device_train_batch_size=16,
    per_device_eval_batch_size=32, learning_rate=1e-3, num_train_epochs=2, eval_strategy="steps", eval_steps=8,
    logging_steps=4, save_strategy="no", lr_scheduler_type="constant_with_warmup", warmup_steps=5,
    optim="adamw_torch", adam_beta2=0.98, eval_accumulation_steps=2, report_to=[], use_cpu=True, seed=0)
cb = LossLogger()
trainer = WeightedTrainer(model=model, args=args, train_dataset=train, eval_dataset=val, data_collator=collate,
                          compute_metrics=compute_metrics, callbacks=[cb])
trainer.train(); print(cb.hist[-3:], trainer.evaluate())
