"""Lightning training of a small latent world model (an encoder, an action-conditioned
GRU dynamics core, and observation/reward decoders) on offline trajectories from a
damped, driven pendulum. Gradient clipping is switched on after a warm-up
(``clip_start_step``).

Modelled on: simchowitzlabpublic/nano-world-model PR #22 "Clip gradients in
configure_gradient_clipping instead of training_step" ("Gradient clipping wasn't
working :("). The ``clip_grad_norm_`` call sat inside ``training_step``, before
``.backward()``. "Lightning calls training_step --> backward() --> clip -->
optimizer.step(), so at the point this ran, p.grad was either None or leftover from
the previous step, not the gradient about to be used." Lightning zeroes the gradients
between ``training_step`` and backward, so the stale gradients are clipped and then
thrown away. "Before the fix, the optimizer's gradient was never capped". In that run
clipping "was enabled at 20K steps".

What is unusual about the loop: the clipping switch depends on ``global_step``, and a
torch ``register_step_post_hook`` on the optimizer records the gradient norm that
``step()`` actually used (the closure runs inside ``step``). The onset is the first step after ``clip_start_step`` whose
gradient norm is above the clip value (found at run time). ``--healthy`` moves the
clip into ``configure_gradient_clipping``.
"""
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv


def pendulum_trajectories(n, horizon, seed):
    g = torch.Generator().manual_seed(seed)
    th = (torch.rand(n, generator=g) - 0.5) * 6
    om = torch.randn(n, generator=g)
    obs, act, rew = [], [], []
    for _ in range(horizon + 1):
        a = torch.tanh(torch.randn(n, generator=g)) * 2
        obs.append(torch.stack([torch.cos(th), torch.sin(th), om / 4], -1))
        act.append(a.unsqueeze(-1))
        rew.append(-(th ** 2 + 0.1 * om ** 2 + 0.01 * a ** 2).unsqueeze(-1) / 10)
        om = 0.98 * om + 0.05 * (-9.8 * torch.sin(th) + a)
        th = th + 0.05 * om
    return TensorDataset(torch.stack(obs, 1), torch.stack(act, 1), torch.stack(rew, 1))


class WorldModel(L.LightningModule):
    def __init__(self, latent=32, lr=3e-3, gradient_clip_norm=0.25, clip_start_step=10, imagine=6):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(3, 64), nn.ELU(), nn.Linear(64, latent))
        self.dynamics = nn.GRUCell(latent + 1, latent)
        self.obs_head = nn.Sequential(nn.Linear(latent, 64), nn.ELU(), nn.Linear(64, 3))
        self.rew_head = nn.Linear(latent, 1)
        self.grad_norm_pre_clip, self.grad_norm_at_step = [], []
        self.onset_reported = False

    def training_step(self, batch, batch_idx):
        if not HEALTHY and self.global_step >= self.hparams.clip_start_step:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.hparams.gradient_clip_norm)
        obs, act, rew = batch
        z = self.encoder(obs[:, 0])
        loss_obs, loss_rew = 0.0, 0.0
        for t in range(self.hparams.imagine):  # open-loop imagination from the first frame
            z = self.dynamics(torch.cat([z, act[:, t]], -1), z)
            loss_obs = loss_obs + F.mse_loss(self.obs_head(z), obs[:, t + 1])
            loss_rew = loss_rew + F.mse_loss(self.rew_head(z), rew[:, t])
        loss = (loss_obs + loss_rew) / self.hparams.imagine
        self.log("train/loss", loss)
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        if HEALTHY and self.global_step >= self.hparams.clip_start_step:
            self.clip_gradients(optimizer, gradient_clip_val=self.hparams.gradient_clip_norm, gradient_clip_algorithm="norm")

    def _grad_norm(self):
        grads = [p.grad.pow(2).sum() for p in self.parameters() if p.grad is not None]
        return torch.stack(grads).sum().sqrt().item() if grads else 0.0

    def on_before_optimizer_step(self, optimizer):
        norm = self._grad_norm()
        self.grad_norm_pre_clip.append(norm)
        if (not HEALTHY and not self.onset_reported and self.global_step >= self.hparams.clip_start_step
                and norm > self.hparams.gradient_clip_norm):
            print(f"ONSET step {self.global_step}")
            self.onset_reported = True

    def on_fit_start(self):
        opt = self.trainer.optimizers[0]
        opt.register_step_post_hook(lambda o, args, kwargs: self.grad_norm_at_step.append(self._grad_norm()))

    def on_train_epoch_end(self):
        print(f"epoch {self.current_epoch} step {self.global_step} loss {self.trainer.callback_metrics['train/loss']:.4f}")

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    L.seed_everything(0, verbose=False)
    ds = pendulum_trajectories(512, 7, seed=1)
    loader = DataLoader(ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(2))
    model = WorldModel()
    trainer = L.Trainer(accelerator="cpu", max_steps=32, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    k = model.hparams.clip_start_step
    after = model.grad_norm_at_step[k:]
    clipped_needed = sum(1 for n in model.grad_norm_pre_clip[k:] if n > model.hparams.gradient_clip_norm)
    print(f"EVIDENCE clip_norm={model.hparams.gradient_clip_norm} max_grad_norm_used_by_step_after_{k}={max(after):.3f} "
          f"steps_needing_clip={clipped_needed}/{len(after)} steps={trainer.global_step}")


if __name__ == "__main__":
    main()
