"""2-D conditional flow matching in Lightning, validated with swapped-in EMA weights.

Modelled on: facebookresearch/flow_matching ``examples/2d_flow_matching.ipynb``
(Lipman et al., "Flow Matching Guide and Code", 2024): an MLP velocity field
v(x_t, t) trained on the checkerboard distribution with the linear (conditional OT)
path x_t = (1 - t) x_0 + t x_1 and target x_1 - x_0, sampled with an Euler ODE
solver; combined with the common "EMA swap for evaluation" pattern (as in
``ema_pytorch`` / diffusers ``EMAModel.store() / copy_to() / restore()``).

What is unusual about the loop (all intentional):
  * an exponential moving average of the weights is updated after every optimizer
    step, and for every validation run the live parameters are *swapped* with the
    EMA copy in place, then swapped back when validation ends;
  * validation runs in the middle of the epoch (``val_check_interval``) and draws
    its noise and time points from a freshly re-seeded ``torch.Generator``, so every
    validation sees identical randomness;
  * validation integrates an ODE with the network (60 forward passes, no backward).
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


def checkerboard(n, gen):
    x1 = torch.rand(n, generator=gen) * 4 - 2
    x2_ = torch.rand(n, generator=gen) - torch.randint(0, 2, (n,), generator=gen).float() * 2
    x2 = x2_ + (torch.floor(x1) % 2)
    return torch.stack([x1, x2], dim=1) * 2


class CheckerboardStream(Dataset):
    def __init__(self, n_batches, batch_size, seed):
        self.n_batches, self.batch_size, self.seed = n_batches, batch_size, seed

    def __len__(self):
        return self.n_batches

    def __getitem__(self, i):
        return checkerboard(self.batch_size, torch.Generator().manual_seed(self.seed + i))


class VelocityMLP(nn.Module):
    def __init__(self, hidden=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, x, t):
        return self.net(torch.cat([x, t[:, None]], dim=1))


def rbf_mmd(x, y, scales=(0.2, 0.5, 1.0, 2.0)):
    xy = torch.cat([x, y])
    d2 = torch.cdist(xy, xy).pow(2)
    k = sum(torch.exp(-d2 / (2 * s * s)) for s in scales)
    n = x.shape[0]
    return k[:n, :n].mean() + k[n:, n:].mean() - 2 * k[:n, n:].mean()


class FlowMatching(L.LightningModule):
    def __init__(self, lr=1e-3, ema_decay=0.98, val_seed=1234, ode_steps=60):
        super().__init__()
        self.save_hyperparameters()
        self.vf = VelocityMLP()
        self.ema = [p.detach().clone() for p in self.vf.parameters()]
        self._backup = None

    def training_step(self, x1, batch_idx):
        x0 = torch.randn_like(x1)
        t = torch.rand(x1.shape[0], device=x1.device)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        loss = F.mse_loss(self.vf(xt, t), x1 - x0)
        self.log("train_loss", loss)
        if batch_idx % 10 == 0:
            print(f"step {self.global_step:3d} fm loss {loss.item():.4f}")
        return loss

    @torch.no_grad()
    def on_train_batch_end(self, outputs, batch, batch_idx):
        d = self.hparams.ema_decay
        for e, p in zip(self.ema, self.vf.parameters()):
            e.lerp_(p.detach(), 1 - d)

    @torch.no_grad()
    def _swap(self):
        for e, p in zip(self.ema, self.vf.parameters()):
            tmp = p.detach().clone()
            p.copy_(e)
            e.copy_(tmp)

    def on_validation_epoch_start(self):
        self._swap()  # live <-> EMA

    def on_validation_epoch_end(self):
        self._swap()  # EMA <-> live, back to training weights
        if not self.trainer.sanity_checking:
            m = self.trainer.callback_metrics
            print(f"step {self.global_step:3d} [EMA] val fm loss {m['val_loss']:.4f} "
                  f"sample MMD {m['val_mmd']:.4f}")

    def validation_step(self, x1, batch_idx):
        gen = torch.Generator().manual_seed(self.hparams.val_seed + batch_idx)
        x0 = torch.randn(x1.shape, generator=gen)
        t = torch.rand(x1.shape[0], generator=gen)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        self.log("val_loss", F.mse_loss(self.vf(xt, t), x1 - x0))
        # Euler integration of dx/dt = v(x, t) from the same noise every time
        x = torch.randn(x1.shape, generator=gen)
        h = 1.0 / self.hparams.ode_steps
        for k in range(self.hparams.ode_steps):
            x = x + h * self.vf(x, torch.full((x.shape[0],), k * h))
        self.log("val_mmd", rbf_mmd(x, x1))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.vf.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=60, eta_min=1e-4)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    L.seed_everything(0)
    train = DataLoader(CheckerboardStream(60, 512, seed=0), batch_size=None, shuffle=True)
    val = DataLoader(CheckerboardStream(1, 512, seed=10_000), batch_size=None)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, val_check_interval=20,
                        num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(FlowMatching(), train, val)


if __name__ == "__main__":
    main()
