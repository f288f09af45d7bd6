"""P07 (class: optimizer updates only part of the model -- unfrozen layers never added to it) -- HF Trainer.

Modelled on the "linear-probe then fine-tune" / gradual-unfreezing recipe done with a
TrainerCallback, and the pitfall explained by sgugger in fastai/fastai#2133 ("the
optimizer needs to be created again because at creation, it only takes trainable
parameters") and asked about in StackOverflow "In pytorch model training, how to freeze,
unfreeze and freeze again some params" (q. 68377722).  HF `Trainer.create_optimizer()`
builds its param groups only from parameters with `requires_grad=True`, so an encoder
frozen before `trainer.train()` and unfrozen later by a callback gets gradients but is
never stepped -- no error, no warning.

A small BERT classifier (built from a config, random init) is trained with the HF Trainer.
Phase 1 (steps 0-11): encoder frozen, only the pooler/classifier head trains.  At step 12
the callback sets `requires_grad=True` on the encoder.  Buggy: the optimizer was created
by the Trainer *after* the encoder was frozen, so from step 12 the encoder silently stays
at its initial weights.  Healthy twin: the optimizer is created (trainer.create_optimizer())
*before* freezing, so it owns every parameter; frozen ones simply have no grad.
"""
import sys
import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainingArguments,
                          TrainerCallback)
from transformers.utils import logging as hf_logging

HEALTHY = "--healthy" in sys.argv
hf_logging.set_verbosity_error()
torch.set_num_threads(1)   # keep CPU runs predictable on small machines
torch.manual_seed(0)

VOCAB, SEQ, N_LABELS = 300, 24, 3
UNFREEZE_AT = 12
MAX_STEPS = 36


class SyntheticTopicDataset(Dataset):
    """Label = which of 3 keyword sets dominates the sequence (needs token-level features)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(10, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.randint(0, N_LABELS, (n,), generator=g)
        for i in range(n):
            k = int(torch.randint(8, 14, (1,), generator=g))
            pos = torch.randperm(SEQ, generator=g)[:k]
            self.ids[i, pos] = 10 + 20 * self.labels[i] + torch.randint(0, 20, (k,), generator=g)
        self.ids[:, 0] = 2                               # [CLS]
        self.mask = torch.ones_like(self.ids)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class GradualUnfreezeCallback(TrainerCallback):
    def __init__(self, unfreeze_at):
        self.unfreeze_at = unfreeze_at
        self.done = False

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not self.done and state.global_step == self.unfreeze_at:
            model.bert.encoder.requires_grad_(True)
            model.bert.embeddings.requires_grad_(True)
            self.done = True
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            n_enc = sum(p.numel() for p in model.bert.encoder.parameters())
            print(f"[callback] step {state.global_step}: unfroze encoder+embeddings ({n_enc} params in encoder)")
            if not HEALTHY and any(id(p) not in owned for p in model.bert.encoder.parameters()):
                print("ONSET step", state.global_step)


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main():
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=N_LABELS,
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = BertForSequenceClassification(cfg)
    train_ds, eval_ds = SyntheticTopicDataset(1024, 1), SyntheticTopicDataset(256, 2)

    args = TrainingArguments(
        output_dir="bugsd_p07_out", max_steps=MAX_STEPS, per_device_train_batch_size=32,
        per_device_eval_batch_size=128, learning_rate=5e-3, weight_decay=0.01,
        lr_scheduler_type="linear", warmup_steps=4, eval_strategy="steps", eval_steps=12,
        logging_steps=4, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      compute_metrics=compute_metrics, callbacks=[GradualUnfreezeCallback(UNFREEZE_AT)])

    if HEALTHY:
        trainer.create_optimizer()          # optimizer owns every parameter before freezing
    # linear probing phase: freeze the encoder and embeddings
    model.bert.encoder.requires_grad_(False)
    model.bert.embeddings.requires_grad_(False)

    trainer.train()
    print("final eval:", {k: round(v, 4) for k, v in trainer.evaluate().items() if k in ("eval_loss", "eval_accuracy")})


if __name__ == "__main__":
    main()
