"""Knowledge distillation of a small CNN from a larger CNN with the Hugging Face
Trainer. A ``DistillationTrainer`` overrides ``compute_loss`` (soft KL at temperature
T plus hard CE). To save compute, the teacher's logits are cached during the first
epoch and reused afterwards.

Modelled on: haitongli/knowledge-distillation-pytorch#4 "The train dataloader will be
shuffled every epoch, Does it really work?" (fixed by PR #16 / #17 "Fix bug about
teacher output"), and modelscope/easydistill#21 "the way of loading teacher's logits
may be wrong". The teacher outputs were stored per *batch position*
(``teacher_outputs[i]`` / ``global_step``-based offsets), while the loader reshuffles
every epoch. "While i is 0, the teacher outputs is from data [0,5,6,8] while the
student outputs is from data [1,3,6,9]." The fix: "include the idx of the training
data and use the idx to obtain the logits of the teachers".

What is unusual about the loop: the teacher lives on the Trainer (outside the model
and outside the optimizer). Its forward only runs during epoch 0; later epochs read the
cache. The dataset returns an ``idx`` column, so ``remove_unused_columns=False`` is
needed, and ``compute_loss`` pops it. Epoch 0 is correct in both variants.
``--healthy`` keys the cache by ``idx`` instead of by step-in-epoch.
"""
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv


class ShapesDataset(Dataset):
    """16x16 images of four shape classes (bar, cross, ring, square) with jitter and noise."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
        self.x, self.y = [], torch.randint(4, (n,), generator=g)
        for c in self.y.tolist():
            cy, cx = (torch.rand(2, generator=g) * 6 + 5).tolist()
            r = float(torch.rand(1, generator=g) * 2 + 3)
            if c == 0:
                img = ((xx - cx).abs() < 1.2).float() * ((yy - cy).abs() < r).float()
            elif c == 1:
                img = (((xx - cx).abs() < 1) & ((yy - cy).abs() < r)) | (((yy - cy).abs() < 1) & ((xx - cx).abs() < r))
            elif c == 2:
                img = (((xx - cx) ** 2 + (yy - cy) ** 2).sqrt() - r).abs() < 1
            else:
                img = ((xx - cx).abs() < r) & ((yy - cy).abs() < r)
            self.x.append((img.float() + 0.4 * torch.randn(16, 16, generator=g)).unsqueeze(0))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i], "idx": i}


class ConvNet(nn.Module):
    def __init__(self, width, n_cls=4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(2 * width, n_cls)

    def forward(self, pixel_values, labels=None):
        logits = self.classifier(self.features(pixel_values).flatten(1))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class DistillationTrainer(Trainer):
    def __init__(self, *args, teacher=None, temperature=4.0, alpha=0.7, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher.eval()
        self.temperature, self.alpha = temperature, alpha
        self.teacher_cache = {}
        self.teacher_label_agreement = {0: [], 1: []}

    def _teacher_logits(self, inputs, idx):
        steps_per_epoch = len(self.train_dataset) // self.args.per_device_train_batch_size
        if HEALTHY:
            keys = idx.tolist()
            if all(k in self.teacher_cache for k in keys):
                return torch.stack([self.teacher_cache[k] for k in keys])
            with torch.no_grad():
                logits = self.teacher(inputs["pixel_values"])["logits"]
            self.teacher_cache.update({k: row for k, row in zip(keys, logits)})
            return logits
        key = self.state.global_step % steps_per_epoch
        if key in self.teacher_cache:
            if self.state.global_step == steps_per_epoch:
                print(f"ONSET step {self.state.global_step}")
            return self.teacher_cache[key]
        with torch.no_grad():
            logits = self.teacher(inputs["pixel_values"])["logits"]
        self.teacher_cache[key] = logits
        return logits

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        idx = inputs.pop("idx")
        outputs = model(**inputs)
        t_logits = self._teacher_logits(inputs, idx)
        if model.training:
            epoch_bucket = 0 if self.state.epoch < 1 else 1
            self.teacher_label_agreement[epoch_bucket].append((t_logits.argmax(1) == inputs["labels"]).float().mean().item())
        T = self.temperature
        soft = F.kl_div(F.log_softmax(outputs["logits"] / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T
        loss = self.alpha * soft + (1 - self.alpha) * outputs["loss"]
        return (loss, outputs) if return_outputs else loss


def train_teacher(ds, steps=150):
    teacher = ConvNet(width=24)
    opt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        idx = torch.randint(len(ds), (64,), generator=g)
        batch = [ds[i] for i in idx.tolist()]
        x, y = torch.stack([b["pixel_values"] for b in batch]), torch.stack([b["labels"] for b in batch])
        loss = teacher(x, y)["loss"]
        opt.zero_grad(); loss.backward(); opt.step()
    return teacher


def accuracy(model, ds):
    model.eval()
    with torch.no_grad():
        x, y = torch.stack(ds.x), ds.y
        return (model(x)["logits"].argmax(1) == y).float().mean().item()


def main():
    torch.manual_seed(0)
    train_ds, test_ds = ShapesDataset(384, seed=1), ShapesDataset(256, seed=2)
    teacher = train_teacher(train_ds)
    print(f"teacher test acc {accuracy(teacher, test_ds):.3f}")
    student = ConvNet(width=12)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=32, num_train_epochs=3,
                             learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=3, weight_decay=0.0,
                             logging_steps=12, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             remove_unused_columns=False, dataloader_drop_last=True, seed=42)
    trainer = DistillationTrainer(model=student, args=args, train_dataset=train_ds, teacher=teacher)
    trainer.train()
    a0 = sum(trainer.teacher_label_agreement[0]) / len(trainer.teacher_label_agreement[0])
    a1 = sum(trainer.teacher_label_agreement[1]) / len(trainer.teacher_label_agreement[1])
    print(f"EVIDENCE teacher_target_label_agreement epoch0={a0:.3f} later_epochs={a1:.3f} "
          f"student_test_acc={accuracy(student, test_ds):.3f} steps={trainer.state.global_step}")


if __name__ == "__main__":
    main()
