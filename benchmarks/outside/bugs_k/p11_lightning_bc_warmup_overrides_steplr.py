"""Offline imitation learning (behaviour cloning) of a pendulum swing-up controller with Lightning.

A logged dataset of (state, action) pairs is generated from a noisy energy-shaping expert on a
torque-limited pendulum; a Gaussian MLP policy is fit by maximum likelihood.  Following the
Lightning docs recipe, the learning-rate warm-up is written by hand in an ``optimizer_step``
override (linear over the first 24 global steps), while ``configure_optimizers`` returns AdamW
with an epoch-interval ``StepLR(step_size=2, gamma=0.5)``.

Modelled on: Lightning-AI/pytorch-lightning#4902 "conflicts of warm-up and lr scheduler": with the
documented ``optimizer_step`` warm-up, "this will change lr in [0, 500] steps, but lr_scheduler will
also change lr in [0, 500] steps, this warm-up method will override lr_scheduler's change" (see
also #9600).  Any StepLR decay that falls inside the warm-up window is written over by the next
warm-up assignment and never comes back: the whole schedule ends up a factor 2 too high.

Unusual about the loop: LR written by hand each step in a hook, an epoch-level scheduler, short
epochs (8 steps) so the first decay (end of epoch 1) lands inside the warm-up.  The decayed LR is
used for exactly one step (16) and lost from step 17 on.  ``--healthy`` expresses warm-up and step
decay as one step-interval ``LambdaLR`` (the same LR for steps 0-16) and drops the override.
"""
import argparse
import math
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
WARMUP, STEPS_PER_EPOCH, EPOCHS, BATCH = 24, 8, 6, 64


def expert_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    th = (torch.rand(n, generator=g) * 2 - 1) * math.pi
    thd = torch.randn(n, generator=g) * 2.0
    energy = 0.5 * thd ** 2 + 9.81 * (torch.cos(th) - 1.0)            # 0 at the upright goal
    pump = torch.tanh(-0.3 * energy) * torch.tanh(2.0 * thd)             # energy shaping
    balance = torch.tanh(-2.0 * torch.sin(th) - 0.6 * thd)             # PD near the top
    w = torch.sigmoid(8.0 * (torch.cos(th) - 0.8))
    action = 2.0 * (w * balance + (1 - w) * pump) + 0.1 * torch.randn(n, generator=g)
    states = torch.stack([torch.cos(th), torch.sin(th), thd / 4.0], 1)
    return TensorDataset(states, action[:, None])


class GaussianBC(L.LightningModule):
    def __init__(self, lr=3e-3, healthy=False):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
        self.lr_log = []

    def forward(self, s):
        mu, log_std = self.net(s).chunk(2, -1)
        return mu, log_std.clamp(-4, 1)

    def training_step(self, batch, batch_idx):
        s, a = batch
        mu, log_std = self(s)
        nll = -torch.distributions.Normal(mu, log_std.exp()).log_prob(a).mean()
        self.log("train/nll", nll, prog_bar=False)
        return nll

    def on_before_optimizer_step(self, optimizer):
        self.lr_log.append(optimizer.param_groups[0]["lr"])     # LR actually used by this step

    def on_train_epoch_end(self):
        print(f"epoch {self.current_epoch} nll {self.trainer.callback_metrics['train/nll'].item():.4f} "
              f"lr_used_last_step {self.lr_log[-1]:.2e}", flush=True)

    def configure_optimizers(self):
        if self.hparams.healthy:
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)

            def warmup_then_step(s):   # same warm-up values as the hook (step 0 and 1 at 1/WARMUP)
                return min(1.0, max(s, 1) / WARMUP) * 0.5 ** ((s // STEPS_PER_EPOCH) // 2)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_step)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr / WARMUP, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return [opt], [sched]

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        if self.hparams.healthy:
            return
        # manually warm up lr without a scheduler (Lightning docs recipe)
        if self.trainer.global_step < WARMUP:
            lr_scale = min(1.0, float(self.trainer.global_step + 1) / WARMUP)
            for pg in optimizer.param_groups:
                pg["lr"] = lr_scale * self.hparams.lr


class OnsetReporter(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not pl_module.hparams.healthy and trainer.global_step == 2 * STEPS_PER_EPOCH + 1:
            print(f"ONSET step {trainer.global_step}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    L.seed_everything(0, verbose=False)
    train = DataLoader(expert_dataset(STEPS_PER_EPOCH * BATCH, 1), batch_size=BATCH, shuffle=True,
                       generator=torch.Generator().manual_seed(2))
    model = GaussianBC(healthy=args.healthy)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[OnsetReporter()])
    trainer.fit(model, train)
    s, a = expert_dataset(1024, 3).tensors
    with torch.no_grad():
        mse = ((model(s)[0] - a) ** 2).mean().item()
    lrs = model.lr_log
    k = 2 * STEPS_PER_EPOCH
    print(f"EVIDENCE lr used at steps {k - 1},{k},{k + 1}: {lrs[k - 1]:.2e}, {lrs[k]:.2e}, {lrs[k + 1]:.2e}; "
          f"lr at last step {lrs[-1]:.2e} (peak {model.hparams.lr:.0e}); {len(lrs)} steps; held-out action MSE {mse:.4f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
