"""FreezeD in a Lightning manual-optimization GAN, silently undone by ``untoggle_optimizer``.

Bug class: parameters frozen partway are unfrozen again by the framework's
save/restore of ``requires_grad`` (freeze placed inside a toggled-optimizer
region).

Modelled on: Lightning-AI/pytorch-lightning#712 "Trainer is setting parameters
with requires_grad=False to requires_grad=True" and the follow-up PR #5574
"[bugfix] Resolve bug with multiple optimizers and toggle" ("It would lose user
requires_grad state ... erroneous in case there are any parameters which are
explicitly kept non-trainable").  Lightning now snapshots ``requires_grad`` in
``toggle_optimizer`` and writes the snapshot back in ``untoggle_optimizer``; a
user freeze that happens *between* the two is overwritten.  The model is a
small GAN trained like the Lightning GAN tutorial (manual optimization,
generator step then discriminator step, each inside toggle/untoggle), with
FreezeD (freeze the discriminator's lower layers after a while) implemented as
a callback.

What goes wrong: the callback freezes the lower discriminator layers from its
``on_before_optimizer_step`` hook.  That hook first fires inside the generator's
``opt_g.step()``, i.e. while the generator optimizer is toggled, and the
following ``untoggle_optimizer(opt_g)`` restores the snapshot taken before the
freeze (``requires_grad=True``).  The callback believes the layers are frozen
and never re-applies the freeze, so the discriminator optimizer keeps updating
them for the rest of training.

Healthy twin: the same callback freezes from ``on_train_batch_start``, outside
any toggled region, so the freeze sticks.

Onset: two optimizer steps per batch (G then D).  The freeze is requested at
batch 12; its G step is optimizer step 24, and the D step that updates the
supposedly frozen layers is optimizer step K = 25 (of 128).
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

Z_DIM = 8
FREEZE_AT_BATCH = 12
BATCH = 64
N_SAMPLES = 2048


def ring_of_gaussians(n, gen):
    k = torch.randint(0, 8, (n,), generator=gen).float()
    centers = torch.stack([torch.cos(k * math.pi / 4), torch.sin(k * math.pi / 4)], dim=1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.lower = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2))
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.lower(x))


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(Z_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                       nn.Linear(64, 2))
        self.discriminator = Discriminator()
        self.batches_seen = 0
        self.opt_steps = 0
        self.lower_at_freeze = None

    def training_step(self, batch, batch_idx):
        real = batch[0]
        opt_g, opt_d = self.optimizers()
        ones = torch.ones(real.size(0), 1)
        zeros = torch.zeros(real.size(0), 1)

        # generator
        self.toggle_optimizer(opt_g)
        fake = self.generator(torch.randn(real.size(0), Z_DIM))
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.opt_steps += 1
        self.untoggle_optimizer(opt_g)

        # discriminator
        if not HEALTHY and self.batches_seen == FREEZE_AT_BATCH:
            print(f"ONSET iteration {self.batches_seen}")
        self.toggle_optimizer(opt_d)
        d_real = self.discriminator(real)
        d_fake = self.discriminator(fake.detach())
        d_loss = 0.5 * (F.binary_cross_entropy_with_logits(d_real, ones)
                        + F.binary_cross_entropy_with_logits(d_fake, zeros))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.opt_steps += 1
        self.untoggle_optimizer(opt_d)

        self.batches_seen += 1
        if self.batches_seen % 32 == 0:
            print(f"batch {self.batches_seen}: g_loss {g_loss.item():.3f} d_loss {d_loss.item():.3f}")

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
        return [opt_g, opt_d]

    def on_train_end(self):
        if self.lower_at_freeze is not None:
            now = torch.cat([p.detach().flatten() for p in self.discriminator.lower.parameters()])
            print(f"lower-D change since freeze {(now - self.lower_at_freeze).norm():.4f}")


class FreezeD(pl.Callback):
    """Freeze the discriminator's lower layers once FREEZE_AT_BATCH batches have been seen."""

    def __init__(self):
        self.done = False

    def _freeze(self, pl_module):
        if self.done or pl_module.batches_seen < FREEZE_AT_BATCH:
            return
        for p in pl_module.discriminator.lower.parameters():
            p.requires_grad_(False)
        pl_module.lower_at_freeze = torch.cat([p.detach().flatten().clone()
                                               for p in pl_module.discriminator.lower.parameters()])
        self.done = True
        print(f"FreezeD: lower discriminator layers frozen at batch {pl_module.batches_seen}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if HEALTHY:
            self._freeze(pl_module)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if not HEALTHY:
            self._freeze(pl_module)  # BUG: runs inside toggle_optimizer(opt_g) ... untoggle


def main():
    pl.seed_everything(0, verbose=False)
    data = ring_of_gaussians(N_SAMPLES, torch.Generator().manual_seed(3))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=BATCH, shuffle=True,
                                         num_workers=0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp, callbacks=[FreezeD()])
        trainer.fit(GAN(), loader)
    print("done")


if __name__ == "__main__":
    main()
