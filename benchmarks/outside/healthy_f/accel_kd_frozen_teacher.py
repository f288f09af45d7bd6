"""Knowledge distillation of a small CNN from a larger frozen teacher, trained with
Accelerate's gradient accumulation and gradient clipping.

Modelled on huggingface/accelerate examples/by_feature/gradient_accumulation.py
(Accelerator(gradient_accumulation_steps=...), `with accelerator.accumulate(model)`,
clip_grad_norm_ only when accelerator.sync_gradients) with the Hinton et al. distillation
loss as written in the PyTorch tutorial "Knowledge Distillation Tutorial"
(KL between temperature-softened teacher and student distributions times T^2, mixed with
the hard-label cross-entropy). The teacher is trained first in this file since nothing is
downloaded.

Unusual loop: a second network runs forward on every batch but is in eval mode (its
Dropout and BatchNorm are inference-time), has requires_grad=False everywhere and is not
passed to the optimizer; the student's optimizer steps only every fourth batch, and the
scheduler is prepared by Accelerate so it also advances only on those steps.
"""
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def make_images(n, seed):
    """8 classes defined by a pair of oriented edges in two halves of the image, plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 8, (n,), generator=g)
    x = torch.randn(n, 1, 16, 16, generator=g) * 0.9
    top, bottom = y // 2 % 4, y % 2
    for i in range(n):
        if top[i] % 2 == 0:
            x[i, 0, 2:7, 4 + top[i] * 2] += 1.5
        else:
            x[i, 0, 2 + top[i], 2:14] += 1.5
        if bottom[i] == 0:
            x[i, 0, 9:15, 8] += 1.5
        else:
            x[i, 0, 12, 2:14] += 1.5
    return TensorDataset(x, y)


def cnn(width, dropout):
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * width * 16, 8))


def accuracy(model, ds):
    model.eval()
    with torch.no_grad():
        return (model(ds.tensors[0]).argmax(1) == ds.tensors[1]).float().mean().item()


set_seed(0)
train_set, test_set = make_images(1536, 1), make_images(512, 2)

# ---- teacher (stand-in for a pretrained model) ----
teacher = cnn(32, 0.3)
t_opt = torch.optim.Adam(teacher.parameters(), lr=2e-3)
for epoch in range(3):
    teacher.train()
    for x, y in DataLoader(train_set, batch_size=64, shuffle=True):
        t_opt.zero_grad()
        F.cross_entropy(teacher(x), y).backward()
        t_opt.step()
teacher.eval()
for p in teacher.parameters():
    p.requires_grad_(False)
print(f"teacher acc {accuracy(teacher, test_set):.3f}")

# ---- student distilled with accelerate ----
ACCUM, T, ALPHA, EPOCHS = 4, 4.0, 0.7, 6
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
student = cnn(8, 0.0)
opt = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=1e-2)
loader = DataLoader(train_set, batch_size=16, shuffle=True)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * len(loader) // ACCUM)
student, opt, loader, sched, teacher = accelerator.prepare(student, opt, loader, sched, teacher)

updates = 0
for epoch in range(EPOCHS):
    student.train()
    tot, n = 0.0, 0
    for x, y in loader:
        with accelerator.accumulate(student):
            with torch.no_grad():
                t_logits = teacher(x)
            s_logits = student(x)
            kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T
            loss = ALPHA * kd + (1 - ALPHA) * F.cross_entropy(s_logits, y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(student.parameters(), 2.0)
                updates += 1
            opt.step()
            sched.step()
            opt.zero_grad()
        tot += loss.item()
        n += 1
    accelerator.print(f"epoch {epoch} loss {tot / n:.4f} lr {sched.get_last_lr()[0]:.2e} "
                      f"student acc {accuracy(student, test_set):.3f} updates {updates}")
