"""Sleep staging from single-channel EEG epochs (TinySleepNet-style 1-D CNN) trained with accelerate's
gradient accumulation, each loaded batch being split into smaller minibatches inside the loop.

Modelled on: huggingface/accelerate#1847 "GradientState being in sync with the DataLoader by default
could be specified in the doc." (https://github.com/huggingface/accelerate/issues/1847): "When the
DataLoader reaches its last batch, the variable `end_of_dataloader` is set to True and Accelerator will
update the weights of the model when one calls `optimizer.step()`, even if the number of gradient
accumulation steps hasn't been reached. ... if you do something like
``for batch in dataloader: for i in range(0, batch.shape[0], args.minibatch_size): with
accelerate.accumulate(model): ...`` All minibatches in the last batch will update your weights,
instead of accumulating."  The maintainers' answer is to turn the dataloader sync off with
``GradientAccumulationPlugin(sync_with_dataloader=False)``.  ``--healthy`` passes that plugin.

Unusual about the loop: the DataLoader yields 32 epochs of EEG per batch and the loop cuts every batch
into 4 minibatches of 8 under ``accelerator.accumulate``.  With ``gradient_accumulation_steps=4`` this
should give exactly one optimizer step per loaded batch.  Clipping runs only on sync steps.  The
prepared cosine scheduler steps with the optimizer.  The first 7 optimizer steps of epoch 0 are
normal; the last batch of every epoch is where the behaviour changes.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
FS, SECONDS, N_STAGES = 100, 10, 5  # W, N1, N2, N3, REM
GA, MINI, BATCH, EPOCHS = 4, 8, 32, 3


def synth_epoch(stage, g):
    t = torch.arange(FS * SECONDS) / FS
    noise = 0.3 * torch.randn(len(t), generator=g)
    r = lambda: torch.rand(1, generator=g).item()
    if stage == 0:    # wake: alpha + beta
        x = torch.sin(2 * math.pi * (9.5 + r()) * t) + 0.4 * torch.sin(2 * math.pi * (20 + 4 * r()) * t)
    elif stage == 1:  # N1: theta
        x = 0.8 * torch.sin(2 * math.pi * (5 + r()) * t)
    elif stage == 2:  # N2: theta background + sleep spindles
        x = 0.6 * torch.sin(2 * math.pi * (5 + r()) * t)
        for c in (2 + 5 * r(), 6 + 3 * r()):
            env = torch.exp(-((t - c) ** 2) / 0.15)
            x = x + 1.2 * env * torch.sin(2 * math.pi * 13 * t)
    elif stage == 3:  # N3: high-amplitude delta
        x = 2.0 * torch.sin(2 * math.pi * (1 + r()) * t) + 0.5 * torch.sin(2 * math.pi * 0.6 * t)
    else:             # REM: sawtooth theta
        x = 0.7 * ((t * (5 + r())) % 1 - 0.5) * 2 + 0.3 * torch.sin(2 * math.pi * 6 * t)
    return x + noise


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, N_STAGES, (n,), generator=g)
    x = torch.stack([synth_epoch(int(s), g) for s in y])[:, None]
    return torch.utils.data.TensorDataset((x - x.mean()) / x.std(), y)


class TinySleepNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, 50, stride=6, padding=24), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(8, 8),
            nn.Dropout(0.3),
            nn.Conv1d(16, 32, 8, padding=4), nn.BatchNorm1d(32), nn.ReLU(),
            nn.Conv1d(32, 32, 8, padding=4), nn.BatchNorm1d(32), nn.ReLU(), nn.AdaptiveMaxPool1d(4))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(128, N_STAGES))

    def forward(self, x):
        return self.classifier(self.features(x))


if HEALTHY:
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=GA, sync_with_dataloader=False))
else:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=GA)

torch.manual_seed(0)
train_ds, val_ds = make_dataset(256, 1), make_dataset(200, 2)
loader = torch.utils.data.DataLoader(train_ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
model = TinySleepNet()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
planned_steps = EPOCHS * len(loader)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: min(1.0, (s + 1) / 3) * 0.5 * (1 + math.cos(math.pi * min(s, planned_steps) / planned_steps)))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

opt_step, mb_since_step, sizes, onset = 0, 0, [], None
model.train()
for epoch in range(EPOCHS):
    for x, y in loader:
        for i in range(0, x.shape[0], MINI):  # minibatches that fit in memory
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x[i:i + MINI]), y[i:i + MINI])
                accelerator.backward(loss)
                mb_since_step += 1
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 2.0)
                    if mb_since_step < GA and onset is None:
                        onset = opt_step
                        if not HEALTHY:
                            print(f"ONSET step {opt_step}")
                    sizes.append(mb_since_step)
                    if opt_step % 6 == 0:
                        print(f"epoch {epoch}  opt step {opt_step:3d}  loss {loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}")
                    opt_step += 1
                    mb_since_step = 0
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

model.eval()
with torch.no_grad():
    xv, yv = val_ds.tensors
    acc = (model(xv).argmax(1) == yv).float().mean().item()
print(f"val accuracy {acc:.3f}")
print(f"EVIDENCE optimizer steps taken {opt_step} (planned {planned_steps}); minibatches per optimizer step "
      f"min {min(sizes)} max {max(sizes)}; steps with fewer than {GA} minibatches {sum(s < GA for s in sizes)}")
