"""Causal language model on DNA reads (GPT-2 config, nucleotide vocabulary) trained with the HF Trainer,
gradient accumulation, and an auxiliary z-loss that a ``compute_loss`` override switches on after
warm-up.

Modelled on: huggingface/transformers#35856 (gradient accumulation loss scaling with a custom loss),
fixed for DPO in huggingface/trl PR #2615 "Fix DPO gradient accumulation loss scaling"
(https://github.com/huggingface/trl/pull/2615).  Since the Trainer's gradient-accumulation fix
(transformers PR #34191, ``num_items_in_batch``), ``Trainer.training_step`` no longer divides the loss
by ``gradient_accumulation_steps`` when the model "accepts loss kwargs" (GPT-2 does).  The model's own
CE is then normalised by the token count of the whole accumulation window, but any term that a
``compute_loss`` override computes itself as a per-micro-batch mean is silently
``gradient_accumulation_steps`` times too strong.  TRL's fix: "Since we compute our own loss ... loss
scaling in the parent class depends on whether the model accepts loss-related kwargs."  ``--healthy``
normalises the z-loss the same way as the CE (sum over tokens / ``num_items_in_batch``).

Unusual about the loop: ``compute_loss`` passes ``num_items_in_batch`` to the model and adds the z-loss
(PaLM-style ``logsumexp(logits)^2``) only from optimizer step 8, once warm-up is over.  With
``gradient_accumulation_steps=4`` the effective z-loss coefficient jumps to 4x from step 8.  Sequences
have variable length, padding labels are -100, and clipping is on (``max_grad_norm=1``).
"""
import random
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv

VOCAB = ["<pad>", "<bos>", "<eos>", "A", "C", "G", "T", "N"]
PAD, BOS, EOS = 0, 1, 2
MOTIFS = ["TATAAA", "GGGCGG", "CCAAT", "TTGACA", "ACGTACGT"]


def synth_read(rnd):
    n = rnd.randint(40, 90)
    seq = []
    while len(seq) < n:
        if rnd.random() < 0.25:
            seq += list(rnd.choice(MOTIFS))
        else:
            prev = seq[-1] if seq else "A"
            bias = {"A": "AATC", "C": "CGGA", "G": "GCCT", "T": "TTAG"}[prev]  # first-order structure
            seq.append(rnd.choice(bias + "ACGT"))
    ids = [BOS] + [VOCAB.index(c) for c in seq[:n]] + [EOS]
    return {"input_ids": ids, "labels": list(ids)}


class ReadDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        rnd = random.Random(seed)
        self.items = [synth_read(rnd) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(features):
    L = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), L), PAD)
    labels = torch.full((len(features), L), -100)
    att = torch.zeros(len(features), L, dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        labels[i, :n] = torch.tensor(f["labels"])
        att[i, :n] = 1
    return {"input_ids": ids, "attention_mask": att, "labels": labels}


class ZLossTrainer(Trainer):
    zloss_coef, zloss_start = 0.05, 8
    aux_weight_per_step = []
    _onset_printed = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        loss = outputs.loss  # CE summed over tokens / tokens in the whole accumulation window
        if self.state.global_step >= self.zloss_start and model.training:
            if not HEALTHY and not self._onset_printed:
                print(f"ONSET step {self.state.global_step}")
                self._onset_printed = True
            mask = inputs["labels"][:, 1:] != -100
            z = torch.logsumexp(outputs.logits[:, :-1].float(), dim=-1)[mask]
            if HEALTHY:
                aux = (z ** 2).sum() / num_items_in_batch
            else:
                aux = (z ** 2).mean()
            loss = loss + self.zloss_coef * aux
            self.aux_weight_per_step.append((self.state.global_step, (aux / (z ** 2).mean()).item()))
        return (loss, outputs) if return_outputs else loss


config = GPT2Config(vocab_size=len(VOCAB), n_positions=128, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
torch.manual_seed(0)
model = GPT2LMHeadModel(config)
train_ds, eval_ds = ReadDataset(1200, 1), ReadDataset(64, 2)

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=8, gradient_accumulation_steps=4, max_steps=30,
        learning_rate=1e-3, warmup_steps=4, lr_scheduler_type="linear", weight_decay=0.01, max_grad_norm=1.0,
        logging_steps=5, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
        dataloader_num_workers=0, remove_unused_columns=False)
    trainer = ZLossTrainer(model=model, args=args, train_dataset=train_ds, data_collator=collate)
    trainer.train()  # logs are printed by the Trainer every 5 steps

model.eval()
with torch.no_grad():
    batch = collate([eval_ds[i] for i in range(len(eval_ds))])
    out = model(**batch)
    mask = batch["labels"][:, 1:] != -100
    z2 = (torch.logsumexp(out.logits[:, :-1], -1)[mask] ** 2).mean().item()
per_step = {}
for s, w in ZLossTrainer.aux_weight_per_step:
    per_step[s] = per_step.get(s, 0.0) + w
print(f"eval CE {out.loss.item():.4f}")
print(f"EVIDENCE z-loss weight per optimizer step (sum over micro-batches, 1.0 = as configured) "
      f"{sum(per_step.values()) / len(per_step):.2f}; held-out mean log(Z)^2 {z2:.3f}")
