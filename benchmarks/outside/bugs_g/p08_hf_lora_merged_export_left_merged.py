"""LoRA adapters merged for a periodic export and never unmerged (HF Trainer).

Bug class: adapter weights merged into the frozen base for inference/export and
left merged, so the adapter path drops out of the forward pass and its
parameters silently stop receiving gradients (and a second merge adds the delta
again).

Modelled on: huggingface/peft PR #1355 "FIX: Make merging of adapter weights
idempotent" (merging happens implicitly, a repeated merge adds the delta again)
and ExponentialML/Text-To-Video-Finetuning PR #112 "Fix Stable LoRA Weighting"
(``merged`` means "run as if at inference"; training assumes unmerged weights).
The program fine-tunes a small BERT classifier with hand-written LoRA adapters
on the attention query/value projections under the HuggingFace ``Trainer``; a
callback exports a merged, deployable copy of the weights every 16 steps.

What goes wrong: the export callback calls ``merge_lora(model)``, saves the
state dict and returns without ``unmerge_lora``.  A merged ``LoRALinear`` only
runs its base layer, so from the next step on ``lora_A``/``lora_B`` get no
gradient (AdamW skips them) and only the classifier head keeps training on top
of frozen features; at the second export the same delta is added to the base
weights a second time.  Loss keeps going down slowly (the head still learns).

Healthy twin: the callback unmerges right after saving.

Onset: the first export happens in ``on_step_end`` after 16 optimizer steps, so
the first update that runs on merged weights is the one at global_step K = 16
(64 steps in total, 48 affected).
"""
import math
import os
import sys
import tempfile

import torch
import torch.nn as nn
from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                          TrainerCallback, TrainingArguments)

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

VOCAB, SEQ_LEN, N_EX, N_CLASSES = 60, 20, 128, 2
RANK, ALPHA = 4, 8
EXPORT_EVERY = 16


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r=RANK, alpha=ALPHA, dropout=0.05):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / r
        self.drop = nn.Dropout(dropout)
        self.merged = False

    def delta(self):
        return (self.lora_B @ self.lora_A) * self.scaling

    @torch.no_grad()
    def merge(self):
        self.base.weight += self.delta()
        self.merged = True

    @torch.no_grad()
    def unmerge(self):
        if self.merged:
            self.base.weight -= self.delta()
            self.merged = False

    def forward(self, x):
        if self.merged:
            return self.base(x)
        return self.base(x) + self.drop(x) @ self.lora_A.t() @ self.lora_B.t() * self.scaling


def add_lora(model):
    for layer in model.bert.encoder.layer:
        att = layer.attention.self
        att.query = LoRALinear(att.query)
        att.value = LoRALinear(att.value)
    for name, p in model.named_parameters():
        p.requires_grad = ("lora_" in name) or name.startswith("classifier")


def lora_modules(model):
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def make_data(n, gen):
    ids = torch.randint(4, VOCAB, (n, SEQ_LEN), generator=gen)
    ids[:, 0] = 1
    # label: does the first half contain more "high" tokens than the second half?
    high = (ids >= (VOCAB + 4) // 2).float()
    labels = (high[:, 1:SEQ_LEN // 2].sum(1) > high[:, SEQ_LEN // 2:].sum(1)).long()
    return ids, labels


class TokDataset(torch.utils.data.Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


class MergedExport(TrainerCallback):
    def __init__(self, model, out_dir):
        self.model, self.out_dir = model, out_dir
        self.onset_printed = False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % EXPORT_EVERY != 0 or state.global_step == state.max_steps:
            return
        for m in lora_modules(self.model):
            m.merge()
        sd = {k: v for k, v in self.model.state_dict().items() if "lora_" not in k}
        torch.save(sd, os.path.join(self.out_dir, f"merged-{state.global_step}.pt"))
        if HEALTHY:
            for m in lora_modules(self.model):
                m.unmerge()
        elif not self.onset_printed:
            print(f"ONSET step {state.global_step}")
            self.onset_printed = True


ids, labels = make_data(N_EX, torch.Generator().manual_seed(3))
train_ds = TokDataset(ids, labels)
config = BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=96, max_position_embeddings=SEQ_LEN, num_labels=N_CLASSES)
model = BertForSequenceClassification(config)
add_lora(model)

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp, per_device_train_batch_size=8, num_train_epochs=4, learning_rate=3e-3,
        weight_decay=0.0, warmup_steps=0, logging_steps=8, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      callbacks=[MergedExport(model, tmp)])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
