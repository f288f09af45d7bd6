"""Long-tailed clinical-note triage (routine / soon / urgent, 15:5:2) with a small
BertForSequenceClassification and the Hugging Face Trainer, using Deferred Re-Weighting
(DRW, Cao et al., NeurIPS 2019): epoch 0 uses plain cross entropy, and from epoch 1 on
every example carries a class-balanced ``sample_weight`` (effective-number weights) that a
custom ``Trainer.compute_loss`` uses for a weighted cross entropy.

Modelled on: huggingface/transformers issue #25054 "removed_unused_columns = True deletes
dataset for custom loss func" (sgugger: columns that are not arguments of the model's
``forward`` are dropped; "we should probably make a note of it in the documentation").
With the default ``remove_unused_columns=True`` the Trainer wraps the collator in a
``RemoveColumnsCollator`` that strips ``sample_weight`` (only an info-level log line), so
``inputs.pop("sample_weight", None)`` returns None and the loss silently falls back to the
unweighted mean.  Nothing changes while all weights are 1 (epoch 0); the first DRW step is
the first wrong one.  The fix is ``remove_unused_columns=False``.

Unusual about the loop: the dataset's per-example weights change at an epoch boundary via a
``TrainerCallback`` that edits the dataset object the DataLoader iterates over; a custom
``compute_loss`` pops extra keys before calling the model; inputs are pre-tokenised ids.
Run: python p10_hf_trainer_drw_sample_weight_column_removed.py [--healthy]
"""
import argparse
import tempfile

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

VOCAB, SEQ, DRW_EPOCH, BETA = 200, 24, 1, 0.99


class NotesDataset(torch.utils.data.Dataset):
    def __init__(self, counts, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
        n = len(self.labels)
        self.ids = torch.randint(10, VOCAB, (n, SEQ), generator=g)
        pos = torch.randint(1, SEQ, (n, 4), generator=g)
        noisy = torch.rand(n, generator=g) < 0.1  # some notes miss the class keyword
        for i in range(n):
            kw = 3 + 2 * self.labels[i] if not noisy[i] else 2
            self.ids[i, pos[i]] = torch.tensor([kw, kw + 1, kw, kw + 1])
        self.ids[:, 0] = 1
        cls_count = torch.bincount(self.labels).float()
        eff = (1 - BETA ** cls_count) / (1 - BETA)
        w = 1.0 / eff
        self.class_weight = w / w.sum() * len(cls_count)
        self.drw = False

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        w = self.class_weight[self.labels[i]] if self.drw else torch.tensor(1.0)
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i], "sample_weight": w}


class WeightedTrainer(Trainer):
    weighted_calls = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        weights = inputs.pop("sample_weight", None)
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels, reduction="none")
        if weights is not None:
            if model.training and not torch.all(weights == 1):
                WeightedTrainer.weighted_calls += 1
            loss = (loss * weights).sum() / weights.sum()
        else:
            loss = loss.mean()
        return (loss, outputs) if return_outputs else loss


class DeferredReweightingCallback(TrainerCallback):
    def __init__(self, dataset):
        self.dataset, self.drw_steps = dataset, 0

    def on_epoch_begin(self, targs, state, control, **kwargs):
        if round(state.epoch) == DRW_EPOCH:
            self.dataset.drw = True
            print(f"DRW on at global step {state.global_step}: class weights {self.dataset.class_weight.tolist()}")
            if not args.healthy:
                print(f"ONSET step {state.global_step}")

    def on_step_end(self, targs, state, control, **kwargs):
        self.drw_steps += int(self.dataset.drw)

    def on_log(self, targs, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"step {state.global_step} loss {logs['loss']:.4f} lr {logs['learning_rate']:.2e}")


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    pred = logits.argmax(-1)
    recall = [float((pred[labels == k] == k).mean()) for k in range(3)]
    return {"accuracy": float((pred == labels).mean()), "recall_urgent": recall[2], "balanced_acc": sum(recall) / 3}


config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=SEQ, num_labels=3)
model = BertForSequenceClassification(config)
train_ds, eval_ds = NotesDataset([120, 40, 16], 1), NotesDataset([40, 40, 40], 2)
cb = DeferredReweightingCallback(train_ds)

with tempfile.TemporaryDirectory() as out_dir:
    targs = TrainingArguments(output_dir=out_dir, num_train_epochs=6, per_device_train_batch_size=16,
                              per_device_eval_batch_size=40, learning_rate=2e-3, weight_decay=0.01, warmup_ratio=0.1,
                              logging_steps=4, eval_strategy="epoch", report_to=[], save_strategy="no", use_cpu=True,
                              disable_tqdm=True, seed=0, remove_unused_columns=not args.healthy)
    trainer = WeightedTrainer(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
                              compute_metrics=compute_metrics, callbacks=[cb])
    trainer.train()
    metrics = trainer.evaluate()

print(f"EVIDENCE DRW steps whose loss actually used the sample weights {WeightedTrainer.weighted_calls}/{cb.drw_steps}; "
      f"urgent-class recall {metrics['eval_recall_urgent']:.3f}; balanced acc {metrics['eval_balanced_acc']:.3f}")
