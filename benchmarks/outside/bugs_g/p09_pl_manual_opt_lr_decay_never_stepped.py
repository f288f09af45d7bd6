"""Per-epoch LR decay silently never applied under Lightning manual optimization.

Bug class: learning-rate schedule never advanced (scheduler returned from
``configure_optimizers`` but nobody calls ``step()``), so the LR stays at its
initial value once the schedule should start decaying.

Modelled on: voicepaw/so-vits-svc-fork PR #291 "fix(train): fix lr_decay not
working" (closes #292): after the port to Lightning manual optimization the
``ExponentialLR`` schedulers were still returned from ``configure_optimizers``
but never stepped, because since Lightning 1.3 (Lightning-AI/pytorch-lightning
#6379, PR #6825) schedulers are not stepped automatically in manual
optimization.  The program is a small 1-D convolutional waveform
enhancement/vocoder-style model trained with ``automatic_optimization =
False`` (chunked backward over the batch, manual clipping) and an
``ExponentialLR`` decay of 0.6 per epoch.

What goes wrong: epoch 0 runs at the base LR as intended.  From the first step
of epoch 1 the LR should be 0.6x, 0.36x, ... of the base LR, but it stays at
the base LR for the whole run.  The loss still goes down, only noisier.

Healthy twin: ``on_train_epoch_end`` steps the scheduler from
``self.lr_schedulers()`` (the fix of the PR).

Onset: 80 examples / batch 8 = 10 optimizer steps per epoch; the first step
that should have used the decayed LR is step K = 10 (6 epochs = 60 steps,
50 affected).
"""
import math
import sys
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
pl.seed_everything(0, verbose=False)

N_EX, T, BATCH = 80, 256, 8


def make_waves(n, gen):
    t = torch.arange(T) / T
    f = torch.randint(2, 12, (n, 3), generator=gen).float()
    ph = torch.rand(n, 3, generator=gen) * 2 * math.pi
    amp = torch.rand(n, 3, generator=gen)
    clean = (amp[:, :, None] * torch.sin(2 * math.pi * f[:, :, None] * t + ph[:, :, None])).sum(1)
    noisy = clean + 0.4 * torch.randn(n, T, generator=gen)
    return noisy[:, None], clean[:, None]


class Enhancer(pl.LightningModule):
    def __init__(self, lr=3e-3, lr_decay=0.6, chunks=2):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.net = nn.Sequential(
            nn.Conv1d(1, 32, 9, padding=4), nn.LeakyReLU(0.1),
            nn.Conv1d(32, 32, 9, padding=8, dilation=2), nn.LeakyReLU(0.1),
            nn.Conv1d(32, 32, 9, padding=16, dilation=4), nn.LeakyReLU(0.1),
            nn.Conv1d(32, 1, 9, padding=4),
        )

    def forward(self, x):
        return x + self.net(x)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        if not HEALTHY and self.current_epoch == 1 and batch_idx == 0:
            print(f"ONSET step {self.trainer.global_step}")
        noisy, clean = batch
        opt.zero_grad()
        total = 0.0
        for x, y in zip(noisy.chunk(self.hparams.chunks), clean.chunk(self.hparams.chunks)):
            pred = self(x)
            spec_p = torch.stft(pred[:, 0], 64, return_complex=True, window=torch.hann_window(64)).abs()
            spec_y = torch.stft(y[:, 0], 64, return_complex=True, window=torch.hann_window(64)).abs()
            loss = (F.l1_loss(pred, y) + F.l1_loss(spec_p, spec_y)) / self.hparams.chunks
            self.manual_backward(loss)
            total += loss.detach()
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
        self.log("train_loss", total, prog_bar=False)

    def on_train_epoch_end(self):
        if HEALTHY:
            self.lr_schedulers().step()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=(0.8, 0.99))
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=self.hparams.lr_decay)
        return [opt], [sched]


noisy, clean = make_waves(N_EX, torch.Generator().manual_seed(11))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(noisy, clean), batch_size=BATCH,
                                     shuffle=True, generator=torch.Generator().manual_seed(1))
model = Enhancer()
with tempfile.TemporaryDirectory() as tmp:
    trainer = pl.Trainer(max_epochs=6, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp)
    trainer.fit(model, loader)
with torch.no_grad():
    print(f"final l1 {F.l1_loss(model(noisy), clean).item():.4f}  steps {trainer.global_step}")
print("done")
