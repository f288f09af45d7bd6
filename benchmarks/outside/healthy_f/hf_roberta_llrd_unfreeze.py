"""RoBERTa-style regressor trained with the HF Trainer using a hand-built optimizer with
layer-wise learning-rate decay, a cosine-with-restarts schedule, gradient accumulation, and
a callback that unfreezes the embeddings part-way through.

Modelled on the Kaggle CommonLit Readability recipes (e.g. the widely copied notebook
"Utilizing Transformer Representations Efficiently" / "LLRD" by Torch-me: AdamW parameter
groups whose LR shrinks by a factor per layer from the head down, no weight decay on bias
and LayerNorm, passed to Trainer via optimizers=(optimizer, scheduler)) combined with the
ULMFiT-style gradual unfreezing done through a TrainerCallback, as asked in the HF forum
thread "Freeze and unfreeze layers during training with Trainer".

Unusual loop: the optimizer holds parameters that have requires_grad=False (and so no
grad) for the first third of training; the callback flips them on at a given global step;
twelve parameter groups have six different learning rates that restart twice.
"""
import tempfile
import warnings

import torch
from transformers import (PrinterCallback, RobertaConfig, RobertaForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments, get_cosine_with_hard_restarts_schedule_with_warmup)
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
warnings.filterwarnings("ignore")
VOCAB, SEQ = 200, 32
# "readability": hard words (ids >= 150) raise the score, long sentences (many tokens before padding) too
HARDNESS = torch.linspace(-1, 1, VOCAB)


class Passages(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(8, SEQ - 1, (n,), generator=g)
        level = torch.rand(n, 1, generator=g)
        ids = (torch.rand(n, SEQ, generator=g) * 0.6 + level * 0.4).mul(VOCAB - 4).long() + 3
        self.mask = (torch.arange(SEQ)[None] <= lengths[:, None]).long()
        ids[:, 0] = 0
        self.ids = torch.where(self.mask.bool(), ids, torch.ones_like(ids))
        hard = (HARDNESS[self.ids] * self.mask).sum(1) / self.mask.sum(1)
        self.target = (3 * hard + 0.03 * lengths).float()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.target[i]}


def llrd_groups(model, head_lr=4e-3, decay=0.85, wd=0.01):
    no_decay = ("bias", "LayerNorm.weight")
    layers = [model.roberta.embeddings] + list(model.roberta.encoder.layer)
    groups = []

    def add(named, lr):
        dec = [p for n, p in named if not n.endswith(no_decay)]
        nodec = [p for n, p in named if n.endswith(no_decay)]
        groups.append({"params": dec, "lr": lr, "weight_decay": wd})
        groups.append({"params": nodec, "lr": lr, "weight_decay": 0.0})

    add(list(model.classifier.named_parameters()), head_lr)
    lr = head_lr
    for layer in reversed(layers):
        lr *= decay
        add(list(layer.named_parameters()), lr)
    return [g for g in groups if g["params"]]


class UnfreezeEmbeddings(TrainerCallback):
    def __init__(self, model, at_step):
        self.model, self.at_step = model, at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            for p in self.model.roberta.embeddings.parameters():
                p.requires_grad_(True)
            print(f"step {state.global_step}: embeddings unfrozen")


torch.manual_seed(0)
config = RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=SEQ + 2, num_labels=1,
                       problem_type="regression", pad_token_id=1, bos_token_id=0, eos_token_id=2)
model = RobertaForSequenceClassification(config)
for p in model.roberta.embeddings.parameters():
    p.requires_grad_(False)

train_ds, val_ds = Passages(1536, 1), Passages(256, 2)
MAX_STEPS = 60
optimizer = torch.optim.AdamW(llrd_groups(model), lr=4e-3)
scheduler = get_cosine_with_hard_restarts_schedule_with_warmup(optimizer, num_warmup_steps=4,
                                                               num_training_steps=MAX_STEPS, num_cycles=3)
print(f"{len(optimizer.param_groups)} param groups, lrs {[round(g['initial_lr'], 5) for g in optimizer.param_groups[::2]]}")

with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=MAX_STEPS, per_device_train_batch_size=16,
                             gradient_accumulation_steps=2, max_grad_norm=1.0, eval_strategy="steps",
                             eval_steps=15, logging_steps=6, save_strategy="no", report_to=[], use_cpu=True,
                             seed=0, disable_tqdm=True, per_device_eval_batch_size=128)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds,
                      optimizers=(optimizer, scheduler), callbacks=[UnfreezeEmbeddings(model, at_step=20)])
    trainer.remove_callback(PrinterCallback)
    trainer.train()

hist = trainer.state.log_history
print("train mse:", [(h["step"], round(h["loss"], 3)) for h in hist if "loss" in h])
print("eval mse:", [(h["step"], round(h["eval_loss"], 3)) for h in hist if "eval_loss" in h])
print(f"target variance {val_ds.target.var():.3f}")
