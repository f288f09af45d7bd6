"""BERT-style sequence classifier on an imbalanced label set, trained with a Trainer
subclass whose compute_loss applies class weights, evaluated/saved every few steps with
early stopping, then resumed from its last checkpoint for more steps.

Modelled on the Hugging Face Trainer documentation ("Customize the Trainer": subclassing
compute_loss with a weighted CrossEntropyLoss, the example given for imbalanced classes)
and the forum thread "How to use class weights with Trainer", together with
EarlyStoppingCallback / load_best_model_at_end and trainer.train(resume_from_checkpoint=True).

Unusual loop: the loss the optimizer sees is computed outside the model (the model is
called without labels); training runs in two Trainer.train calls, the second restoring
model, optimizer, scheduler, RNG and global step from checkpoint-N on disk and extending
max_steps; a TrainerCallback records every log line.
"""
import tempfile
import warnings

import torch
import torch.nn as nn
from transformers import (BertConfig, BertForSequenceClassification, EarlyStoppingCallback, PrinterCallback,
                          Trainer, TrainerCallback, TrainingArguments)
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore", message="mtime may not be reliable")

VOCAB, SEQ = 120, 20


class SyntheticReviews(torch.utils.data.Dataset):
    """3 classes with priors 70/20/10; class c's sequences contain marker token 10+c a few times."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.multinomial(torch.tensor([0.7, 0.2, 0.1]), n, replacement=True, generator=g)
        self.ids = torch.randint(20, VOCAB, (n, SEQ), generator=g)
        for i, c in enumerate(self.labels.tolist()):
            pos = torch.randperm(SEQ - 1, generator=g)[:3] + 1
            self.ids[i, pos] = 10 + c
        self.ids[:, 0] = 2  # [CLS]
        lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
        self.mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
        self.ids = self.ids * self.mask

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class WeightedLossTrainer(Trainer):
    def __init__(self, *args, class_weights=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.class_weights = class_weights

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss_fct = nn.CrossEntropyLoss(weight=self.class_weights.to(outputs.logits.device))
        loss = loss_fct(outputs.logits.view(-1, model.config.num_labels), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


class LogRecorder(TrainerCallback):
    def __init__(self):
        self.train_losses, self.evals = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.train_losses.append((state.global_step, logs["loss"]))
        if logs and "eval_loss" in logs:
            self.evals.append((state.global_step, logs["eval_loss"], logs.get("eval_macro_recall")))


def compute_metrics(pred):
    preds = pred.predictions.argmax(-1)
    labels = pred.label_ids
    recalls = [((preds == c) & (labels == c)).sum() / max((labels == c).sum(), 1) for c in range(3)]
    return {"macro_recall": float(sum(recalls) / 3)}


train_ds, eval_ds = SyntheticReviews(1200, 1), SyntheticReviews(300, 2)
counts = torch.bincount(train_ds.labels, minlength=3).float()
weights = counts.sum() / (3 * counts)

config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=64, num_labels=3)
torch.manual_seed(0)
model = BertForSequenceClassification(config)

with tempfile.TemporaryDirectory() as out:
    def make_args(max_steps):
        return TrainingArguments(
            output_dir=out, max_steps=max_steps, per_device_train_batch_size=32, per_device_eval_batch_size=100,
            learning_rate=1e-3, warmup_steps=5, lr_scheduler_type="linear", weight_decay=0.01,
            eval_strategy="steps", eval_steps=10, save_strategy="steps", save_steps=10, save_total_limit=3,
            logging_steps=5, load_best_model_at_end=True, metric_for_best_model="macro_recall",
            greater_is_better=True, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
            dataloader_num_workers=0)

    rec = LogRecorder()
    trainer = WeightedLossTrainer(model=model, args=make_args(40), train_dataset=train_ds, eval_dataset=eval_ds,
                                  compute_metrics=compute_metrics, class_weights=weights,
                                  callbacks=[rec, EarlyStoppingCallback(early_stopping_patience=4)])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    print("phase 1:", [(s, round(l, 3)) for s, l in rec.train_losses], "evals", [(s, round(r, 3)) for s, _, r in rec.evals])

    # resume in a fresh Trainer (as after a pre-emption) and train further
    torch.manual_seed(1)
    model2 = BertForSequenceClassification(config)
    rec2 = LogRecorder()
    trainer2 = WeightedLossTrainer(model=model2, args=make_args(80), train_dataset=train_ds, eval_dataset=eval_ds,
                                   compute_metrics=compute_metrics, class_weights=weights,
                                   callbacks=[rec2, EarlyStoppingCallback(early_stopping_patience=4)])
    trainer2.remove_callback(PrinterCallback)
    trainer2.train(resume_from_checkpoint=True)
    print("phase 2:", [(s, round(l, 3)) for s, l in rec2.train_losses], "evals", [(s, round(r, 3)) for s, _, r in rec2.evals])
    final = trainer2.evaluate()
    print(f"best checkpoint reloaded: eval_loss {final['eval_loss']:.4f} macro_recall {final['eval_macro_recall']:.3f}")
