"""Early dropout for a small ViT trained with the Hugging Face Trainer (synthetic texture images).

"Early dropout" (Liu et al., ICML 2023, "Dropout Reduces Underfitting"; facebookresearch/dropout)
keeps dropout on for the first part of training and then switches it off to counter underfitting.
Here a ``TrainerCallback`` turns dropout off at the start of epoch 1 (after 8 optimizer steps)
of a ``ViTForImageClassification`` built from a ``ViTConfig`` (hidden/attention dropout 0.1) and
trained with ``Trainer`` (cosine schedule with warm-up, per-epoch evaluation).

Modelled on: huggingface/transformers#14914 "How to update config after model inited?": the
user sets ``bert.config.hidden_dropout_prob = 0`` / ``attention_probs_dropout_prob = 0`` on an
already-built model to change dropout during training and finds it "invalid" -- the ``nn.Dropout``
modules read the probability once, in ``__init__``, so editing ``model.config`` afterwards changes
nothing.  facebookresearch/dropout's ``update_dropout`` instead sets ``m.p`` on every ``nn.Dropout``
(for HF ViT the attention-probability dropout also lives in ``ViTSelfAttention.dropout_prob``).

Unusual about the loop: a regularisation schedule implemented in a callback, with the callback
receiving the live model through ``on_epoch_begin``.  Buggy: only the config is edited; dropout
silently stays at 0.1 for the rest of training.  ``--healthy`` also updates the modules.
"""
import argparse
import tempfile
import time

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import (Trainer, TrainerCallback, TrainingArguments, ViTConfig,
                          ViTForImageClassification)
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
N_CLS = 6


class Textures(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, N_CLS, (n,), generator=g)
        xx, yy = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
        freq = torch.tensor([0.3, 0.6, 0.9, 0.3, 0.6, 0.9])
        self.x = torch.empty(n, 3, 32, 32)
        for i in range(n):
            c = int(self.y[i])
            coord = xx if c < 3 else (xx + yy) * 0.7
            ph = float(torch.rand(1, generator=g)) * 6.28
            col = torch.rand(3, generator=g)[:, None, None]
            self.x[i] = col * torch.sin(freq[c] * coord + ph) + 0.6 * torch.randn(3, 32, 32, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class EarlyDropoutCallback(TrainerCallback):
    def __init__(self, until_epoch, healthy):
        self.until_epoch, self.healthy = until_epoch, healthy

    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        if round(state.epoch) == self.until_epoch:
            model.config.hidden_dropout_prob = 0.0
            model.config.attention_probs_dropout_prob = 0.0
            if self.healthy:   # the modules hold their own probabilities
                for m in model.modules():
                    if isinstance(m, nn.Dropout):
                        m.p = 0.0
                    if hasattr(m, "dropout_prob"):      # ViTSelfAttention: SDPA dropout_p
                        m.dropout_prob = 0.0
            else:
                print(f"ONSET step {state.global_step}", flush=True)
            print(f"epoch {round(state.epoch)}: early-dropout phase over, config dropout set to 0", flush=True)


def compute_metrics(p):
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=3,
                    num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, num_labels=N_CLS)
    model = ViTForImageClassification(cfg)
    train_ds, eval_ds = Textures(256, 1), Textures(128, 2)
    out = tempfile.mkdtemp(prefix="vit_early_dropout_")
    targs = TrainingArguments(
        output_dir=out, per_device_train_batch_size=32, per_device_eval_batch_size=64,
        num_train_epochs=5, learning_rate=1e-3, weight_decay=0.05, lr_scheduler_type="cosine",
        warmup_steps=4, eval_strategy="epoch", logging_steps=8, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
                      compute_metrics=compute_metrics,
                      callbacks=[EarlyDropoutCallback(until_epoch=1, healthy=args.healthy)])
    trainer.train()
    metrics = trainer.evaluate()

    active = [m.p for m in model.modules() if isinstance(m, nn.Dropout) and m.p > 0]
    active += [m.dropout_prob for m in model.modules() if getattr(m, "dropout_prob", 0) > 0]
    model.train()
    batch = torch.stack([train_ds[i]["pixel_values"] for i in range(8)])
    with torch.no_grad():
        diff = (model(pixel_values=batch).logits - model(pixel_values=batch).logits).abs().max().item()
    print(f"EVIDENCE config.hidden_dropout_prob={model.config.hidden_dropout_prob}; dropout sites "
          f"(nn.Dropout + attention dropout_prob) still active after the early phase: {len(active)} (p={active[0] if active else 0.0}); "
          f"train-mode forward non-determinism {diff:.4f}; final eval accuracy {metrics['eval_accuracy']:.3f} "
          f"after {trainer.state.global_step} steps")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
