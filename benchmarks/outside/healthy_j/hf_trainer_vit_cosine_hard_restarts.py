"""Image classification with a ViT built from config and the HF Trainer, SGDR-style schedule.

Modelled on: huggingface/transformers ``examples/pytorch/image-classification/
run_image_classification.py`` (label2id/id2label from the label names, train transforms
with random resized crop + horizontal flip applied on the fly through
``set_transform``, eval transforms without randomness, a ``collate_fn`` stacking
``pixel_values`` and ``labels``, ``remove_unused_columns=False``, accuracy metric),
with the warm-restart schedule of Loshchilov & Hutter, "SGDR" (2017) selected through
``lr_scheduler_type="cosine_with_restarts"`` and ``lr_scheduler_kwargs={"num_cycles": 3}``.
The model is ``ViTForImageClassification(ViTConfig(...))``; images are synthetic.

What is unusual about the loop:
  * The learning rate jumps from ~0 back to the peak twice during training (hard
    restarts), so the loss can rise right after each restart; a callback records the lr
    at every step and reports where the restarts happened.
  * Warm-up from lr 0: the first optimizer step does not change the weights.
  * Non-reentrant gradient checkpointing in the encoder; label smoothing 0.1 (so the
    training loss cannot reach 0).
  * Evaluation every 15 steps, i.e. in the middle of an epoch (40 steps per epoch).
  * Train-time augmentation is random per sample (global RNG, seeded by the Trainer);
    evaluation images are fixed.
"""
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (Trainer, TrainerCallback, TrainingArguments, ViTConfig,
                          ViTForImageClassification)

torch.set_num_threads(1)

LABELS = ["horizontal", "vertical", "diagonal", "checker"]
IMG = 24


def render(label, g):
    yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    freq = 0.6 + 0.4 * torch.rand(1, generator=g).item()
    phase = 6.28 * torch.rand(1, generator=g).item()
    pattern = {
        0: torch.sin(freq * yy + phase),
        1: torch.sin(freq * xx + phase),
        2: torch.sin(freq * (xx + yy) / 1.4 + phase),
        3: torch.sin(freq * xx + phase) * torch.sin(freq * yy + phase),
    }[label]
    colour = 0.5 + torch.rand(3, 1, 1, generator=g)
    return pattern.unsqueeze(0) * colour + 0.5 * torch.randn(3, 32, 32, generator=g)


class PatternImages(torch.utils.data.Dataset):
    """Stores 32x32 'raw' images; the transform is applied lazily like ``set_transform``."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, len(LABELS), (n,), generator=g).tolist()
        self.images = [render(lbl, g) for lbl in self.labels]
        self.transform = None

    def set_transform(self, transform):
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        example = {"image": self.images[i], "label": self.labels[i]}
        return self.transform(example) if self.transform else example


def normalize(x):
    return (x - 0.5) / 0.5


def train_transforms(example):
    img = example["image"]
    # RandomResizedCrop(IMG, scale=(0.6, 1.0)) + RandomHorizontalFlip
    scale = float(torch.empty(1).uniform_(0.6, 1.0))
    size = max(8, int(round(32 * scale ** 0.5)))
    top, left = torch.randint(0, 32 - size + 1, (2,)).tolist()
    crop = img[:, top:top + size, left:left + size]
    crop = F.interpolate(crop.unsqueeze(0), size=(IMG, IMG), mode="bilinear", align_corners=False)[0]
    if torch.rand(1).item() < 0.5:
        crop = crop.flip(-1)
    return {"pixel_values": normalize(crop), "label": example["label"]}


def val_transforms(example):
    img = F.interpolate(example["image"].unsqueeze(0), size=(IMG, IMG), mode="bilinear",
                        align_corners=False)[0]
    return {"pixel_values": normalize(img), "label": example["label"]}


def collate_fn(examples):
    pixel_values = torch.stack([e["pixel_values"] for e in examples])
    labels = torch.tensor([e["label"] for e in examples])
    return {"pixel_values": pixel_values, "labels": labels}


def compute_metrics(p):
    return {"accuracy": float((np.argmax(p.predictions, axis=1) == p.label_ids).mean())}


class LrRecorder(TrainerCallback):
    def __init__(self):
        self.lrs = []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.lrs.append(lr_scheduler.get_last_lr()[0])


def main():
    label2id = {name: i for i, name in enumerate(LABELS)}
    id2label = {i: name for i, name in enumerate(LABELS)}
    config = ViTConfig(image_size=IMG, patch_size=6, num_channels=3, hidden_size=64,
                       num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                       num_labels=len(LABELS), label2id=label2id, id2label=id2label)
    model = ViTForImageClassification(config)

    train_ds, eval_ds = PatternImages(640, seed=1), PatternImages(192, seed=2)
    train_ds.set_transform(train_transforms)
    eval_ds.set_transform(val_transforms)

    recorder = LrRecorder()
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, remove_unused_columns=False, per_device_train_batch_size=16,
            per_device_eval_batch_size=64, learning_rate=2e-3, weight_decay=0.05,
            max_steps=60, warmup_steps=3, lr_scheduler_type="cosine_with_restarts",
            lr_scheduler_kwargs={"num_cycles": 3}, label_smoothing_factor=0.1,
            gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
            eval_strategy="steps", eval_steps=15, logging_steps=5, save_strategy="no",
            report_to=[], use_cpu=True, disable_tqdm=True, seed=1337, dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          data_collator=collate_fn, compute_metrics=compute_metrics,
                          callbacks=[recorder])
        train_result = trainer.train()
        metrics = trainer.evaluate()

    restarts = [i + 1 for i in range(1, len(recorder.lrs)) if recorder.lrs[i] > recorder.lrs[i - 1] * 2]
    print(f"train_loss {train_result.training_loss:.4f}  eval {metrics}")
    print(f"optimizer steps {len(recorder.lrs)}, lr restarts after steps {restarts}, "
          f"lr min {min(recorder.lrs):.2e} max {max(recorder.lrs):.2e}")


if __name__ == "__main__":
    main()
