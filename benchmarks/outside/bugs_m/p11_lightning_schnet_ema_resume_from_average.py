"""SchNet-style message-passing network for molecular energies (Lightning), with an EMA callback that
validates on the averaged weights and a checkpoint written at the end of validation, followed by a
resumed ``fit(ckpt_path=...)``.

Modelled on: atomistic-machine-learning/schnetpack PR #785 "Fix EMA callback: resume training from the
raw weights, not the EMA average" (https://github.com/atomistic-machine-learning/schnetpack/pull/785).
"Checkpoints are written during validation, when on_validation_epoch_start has copy_to()'d the EMA
average into the model; restore() only runs at the next on_train_epoch_start.  A run resumed from
such a checkpoint therefore loads the EMA average as its model weights, and on_fit_start immediately
called store(), overwriting the stored raw weights -- so the subsequent restore() was a no-op and
training silently continued from the EMA average instead of the raw weights a continuous run would
have used."  Same class of bug: Megvii-BaseDetection/YOLOX#1318 "Incorrect resume".  ``--healthy``
applies the PR's fix: on resume, ``on_fit_start`` puts the stored raw weights (saved in the callback
state) back into the model instead of calling ``store()``.

Unusual about the loop: the model's weights are swapped by a callback around every validation.  The
checkpoint is written by a small user callback in ``on_validation_end`` (the default ModelCheckpoint
is disabled), while the EMA weights are in place.  The second ``Trainer`` resumes at epoch 2 / step 16
with the optimizer state and a new EMA callback whose state comes from the checkpoint.  Molecules have a
fixed 6 atoms, so message passing is dense.
"""
import math
import os
import sys
import tempfile

import warnings

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
HEALTHY = "--healthy" in sys.argv
N_ATOMS, N_TYPES, F_DIM, N_RBF, CUTOFF = 6, 3, 32, 16, 5.0


def make_molecules(n, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor([[0, 0, 0], [1.1, 0, 0], [-0.5, 1.0, 0], [-0.5, -1.0, 0.2], [1.8, 0.9, 0.1], [0.2, 0.1, 1.2]])
    pos = base + 0.18 * torch.randn(n, N_ATOMS, 3, generator=g)
    types = torch.randint(0, N_TYPES, (n, N_ATOMS), generator=g)
    d = torch.cdist(pos, pos) + torch.eye(N_ATOMS) * 10
    eps = torch.tensor([[0.3, 0.5, 0.4], [0.5, 0.9, 0.7], [0.4, 0.7, 0.6]])[types[:, :, None], types[:, None, :]]
    r0 = torch.tensor([[0.9, 1.0, 1.0], [1.0, 1.3, 1.2], [1.0, 1.2, 1.25]])[types[:, :, None], types[:, None, :]]
    morse = eps * ((1 - torch.exp(-1.8 * (d - r0))) ** 2 - 1)
    energy = 0.5 * morse.sum((1, 2)) + 0.01 * torch.randn(n, generator=g)
    return torch.utils.data.TensorDataset(pos, types, energy)


def ssp(x):
    return F.softplus(x) - math.log(2.0)


class Interaction(nn.Module):
    def __init__(self):
        super().__init__()
        self.filter1, self.filter2 = nn.Linear(N_RBF, F_DIM), nn.Linear(F_DIM, F_DIM)
        self.in2f, self.f2out, self.dense = nn.Linear(F_DIM, F_DIM, bias=False), nn.Linear(F_DIM, F_DIM), nn.Linear(F_DIM, F_DIM)

    def forward(self, x, rbf, fcut):
        w = self.filter2(ssp(self.filter1(rbf))) * fcut[..., None]  # B x N x N x F
        m = (self.in2f(x)[:, None, :, :] * w).sum(2)
        return x + self.dense(ssp(self.f2out(m)))


class SchNetLit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(N_TYPES, F_DIM)
        self.interactions = nn.ModuleList([Interaction(), Interaction()])
        self.out = nn.Sequential(nn.Linear(F_DIM, F_DIM // 2), nn.SiLU(), nn.Linear(F_DIM // 2, 1))
        self.register_buffer("centers", torch.linspace(0, CUTOFF, N_RBF))

    def forward(self, pos, types):
        d = torch.cdist(pos, pos)
        rbf = torch.exp(-10.0 * (d[..., None] - self.centers) ** 2)
        fcut = 0.5 * (torch.cos(d * math.pi / CUTOFF) + 1) * (d < CUTOFF) * (1 - torch.eye(N_ATOMS))
        x = self.embedding(types)
        for block in self.interactions:
            x = block(x, rbf, fcut)
        return self.out(x).squeeze(-1).sum(1)

    def training_step(self, batch, batch_idx):
        pos, types, e = batch
        return F.mse_loss(self(pos, types), e)

    def validation_step(self, batch, batch_idx):
        pos, types, e = batch
        self.val_mae.append((self(pos, types) - e).abs().mean().item())

    def on_validation_epoch_start(self):
        self.val_mae = []

    def on_validation_epoch_end(self):
        print(f"epoch {self.current_epoch}  step {self.global_step:3d}  val MAE (EMA weights) {sum(self.val_mae) / len(self.val_mae):.4f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-3)


class ExponentialMovingAverage(L.Callback):
    """EMA with store / copy_to / restore around validation, as in schnetpack's callback."""

    def __init__(self, decay=0.9):
        self.decay, self.ema, self.collected, self.loaded = decay, None, None, False

    def state_dict(self):
        return {"ema": self.ema, "collected": self.collected}

    def load_state_dict(self, state):
        self.ema, self.collected, self.loaded = state["ema"], state["collected"], True

    def store(self, pl_module):
        self.collected = [p.detach().clone() for p in pl_module.parameters()]

    def restore(self, pl_module):
        with torch.no_grad():
            for p, c in zip(pl_module.parameters(), self.collected):
                p.copy_(c)

    def on_fit_start(self, trainer, pl_module):
        if self.ema is None:
            self.ema = [p.detach().clone() for p in pl_module.parameters()]
        if HEALTHY and self.loaded:
            self.restore(pl_module)  # resume from the raw weights captured before the save
        else:
            self.store(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            for e, p in zip(self.ema, pl_module.parameters()):
                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def on_validation_epoch_start(self, trainer, pl_module):
        self.store(pl_module)
        with torch.no_grad():
            for p, e in zip(pl_module.parameters(), self.ema):
                p.copy_(e)

    def on_train_epoch_start(self, trainer, pl_module):
        self.restore(pl_module)


class SaveAtValidationEnd(L.Callback):
    def __init__(self, path):
        self.path = path

    def on_validation_end(self, trainer, pl_module):
        trainer.save_checkpoint(self.path)


class Probe(L.Callback):
    """Records how far the weights used by the first resumed step are from the raw weights at save time."""

    def __init__(self, raw_reference):
        self.raw, self.dist = raw_reference, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.dist is None:
            self.step = trainer.global_step
            self.dist = max((p.detach() - r).abs().max().item() for p, r in zip(pl_module.parameters(), self.raw))
            if not HEALTHY:
                print(f"ONSET step {trainer.global_step}")


def make_trainer(max_epochs, callbacks):
    return L.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     callbacks=callbacks)


L.seed_everything(0, verbose=False)
train_ds, val_ds = make_molecules(256, 1), make_molecules(128, 2)
train_loader = lambda: torch.utils.data.DataLoader(train_ds, batch_size=32, shuffle=True,
                                                   generator=torch.Generator().manual_seed(3))
val_loader = torch.utils.data.DataLoader(val_ds, batch_size=64)

with tempfile.TemporaryDirectory() as tmp:
    ckpt = os.path.join(tmp, "last.ckpt")
    ema1 = ExponentialMovingAverage()
    model = SchNetLit()
    make_trainer(2, [ema1, SaveAtValidationEnd(ckpt)]).fit(model, train_loader(), val_loader)  # steps 0-15, "preempted"
    raw_at_save = [c.clone() for c in ema1.collected]

    model2 = SchNetLit()
    probe = Probe(raw_at_save)
    trainer = make_trainer(5, [ExponentialMovingAverage(), SaveAtValidationEnd(ckpt), probe])
    trainer.fit(model2, train_loader(), val_loader, ckpt_path=ckpt)  # steps 16-39

print(f"EVIDENCE max abs difference between the weights of the first resumed step and the raw weights at "
      f"the checkpoint {probe.dist:.6f}; resumed at global step {probe.step}")
