"""1-D VQ-VAE on synthetic audio with an EMA codebook and dead-code restarts (Lightning).

Modelled on: openai/jukebox ``jukebox/vqvae/bottleneck.py`` (``BottleneckBlock``: ``init_k`` from
random encoder outputs on the first batch, ``update_k`` with EMA sums ``k_sum``/``k_elem``
(mu = 0.99), codes whose EMA usage falls below ``threshold`` = 1.0 replaced by random encoder
outputs, commit loss, straight-through pass-through) and ``jukebox/vqvae/vqvae.py`` (conv
encoder/decoder, ``recons_loss + commit * commit_loss``), wrapped in a LightningModule.

What is unusual about the loop (deliberate):
  * The codebook is *not* a parameter: it is a set of buffers rewritten in-place under
    ``torch.no_grad()`` inside ``training_step`` (EMA k-means), never touched by the optimizer.
  * Dead codes are re-initialised mid-run from random encoder outputs of the current batch;
    the logged ``restarted`` count is the number of codes replaced at that step.
  * Straight-through estimator ``x + (x_q - x).detach()``: the quantiser is skipped in backward.
  * Codebook updates are gated on ``self.training`` so validation never changes the codebook.
  * Validation runs in the middle of the single training epoch (``val_check_interval``).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


class BottleneckBlock(nn.Module):
    def __init__(self, k_bins, emb_width, mu, threshold=1.0):
        super().__init__()
        self.k_bins, self.emb_width, self.mu, self.threshold = k_bins, emb_width, mu, threshold
        self.register_buffer("k", torch.zeros(k_bins, emb_width))
        self.register_buffer("k_sum", torch.zeros(k_bins, emb_width))
        self.register_buffer("k_elem", torch.zeros(k_bins))
        self.register_buffer("initialised", torch.tensor(False))

    def _tile(self, x):
        d, ew = x.shape
        if d < self.k_bins:
            n_repeats = (self.k_bins + d - 1) // d
            x = x.repeat(n_repeats, 1)
            x = x + torch.randn_like(x) * (0.01 / np.sqrt(ew))
        return x

    @torch.no_grad()
    def init_k(self, x):
        y = self._tile(x)
        self.k.copy_(y[torch.randperm(y.shape[0])][:self.k_bins])
        self.k_sum.copy_(self.k)
        self.k_elem.fill_(1.0)
        self.initialised.fill_(True)

    @torch.no_grad()
    def update_k(self, x, x_l):
        onehot = torch.zeros(self.k_bins, x.shape[0], device=x.device)
        onehot.scatter_(0, x_l.view(1, x.shape[0]), 1)
        _k_sum = onehot @ x
        _k_elem = onehot.sum(dim=-1)
        y = self._tile(x)
        _k_rand = y[torch.randperm(y.shape[0])][:self.k_bins]
        old_k = self.k.clone()
        self.k_sum.mul_(self.mu).add_(_k_sum, alpha=1 - self.mu)
        self.k_elem.mul_(self.mu).add_(_k_elem, alpha=1 - self.mu)
        usage = (self.k_elem.view(self.k_bins, 1) >= self.threshold).float()
        self.k.copy_(usage * (self.k_sum / self.k_elem.view(self.k_bins, 1)) + (1 - usage) * _k_rand)
        prob = _k_elem / _k_elem.sum()
        return dict(entropy=-(prob * torch.log(prob + 1e-8)).sum(),
                    used_curr=(_k_elem >= self.threshold).sum().float(),
                    usage=usage.sum(), restarted=(1 - usage).sum(),
                    dk=torch.norm(self.k - old_k) / np.sqrt(old_k.numel()))

    def quantise(self, x):
        k_w = self.k.t()
        distance = (x ** 2).sum(-1, keepdim=True) - 2 * x @ k_w + (k_w ** 2).sum(0, keepdim=True)
        min_distance, x_l = torch.min(distance, dim=-1)
        return x_l, min_distance.mean()

    def forward(self, x, update_k=True):
        N, width, T = x.shape
        x = x.permute(0, 2, 1).reshape(-1, width)
        if update_k and not bool(self.initialised):
            self.init_k(x)
        x_l, fit = self.quantise(x)
        x_d = F.embedding(x_l, self.k)
        metrics = self.update_k(x, x_l) if update_k else {}
        commit_loss = torch.norm(x_d.detach() - x) ** 2 / np.prod(x.shape)
        x_d = x + (x_d - x).detach()  # straight-through
        x_d = x_d.view(N, T, width).permute(0, 2, 1).contiguous()
        return x_l.view(N, T), x_d, commit_loss, dict(fit=fit, **metrics)


def res_block(c):
    return nn.Sequential(nn.ReLU(), nn.Conv1d(c, c, 3, padding=1), nn.ReLU(), nn.Conv1d(c, c, 1))


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.block = res_block(c)

    def forward(self, x):
        return x + self.block(x)


class VQVAE(L.LightningModule):
    def __init__(self, width=32, emb_width=32, k_bins=64, mu=0.99, commit=0.02, lr=3e-4, warmup=10):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(
            nn.Conv1d(1, width, 4, stride=2, padding=1), Residual(width),
            nn.Conv1d(width, width, 4, stride=2, padding=1), Residual(width),
            nn.Conv1d(width, emb_width, 3, padding=1))
        self.bottleneck = BottleneckBlock(k_bins, emb_width, mu)
        self.decoder = nn.Sequential(
            nn.Conv1d(emb_width, width, 3, padding=1), Residual(width),
            nn.ConvTranspose1d(width, width, 4, stride=2, padding=1), Residual(width),
            nn.ConvTranspose1d(width, 1, 4, stride=2, padding=1))

    def forward(self, x):
        x_l, x_q, commit_loss, metrics = self.bottleneck(self.encoder(x), update_k=self.training)
        if not self.training:
            x_q = x_q.detach()
        return self.decoder(x_q), commit_loss, metrics

    def training_step(self, batch, batch_idx):
        (x,) = batch
        x_out, commit_loss, m = self(x)
        recons_loss = F.mse_loss(x_out, x)
        loss = recons_loss + self.hparams.commit * commit_loss
        self.log_dict({"train/loss": loss, "train/recons": recons_loss, "train/commit": commit_loss,
                       "codebook/usage": m["usage"], "codebook/restarted": m["restarted"],
                       "codebook/entropy": m["entropy"], "codebook/dk": m["dk"]}, prog_bar=False)
        if batch_idx % 10 == 0:
            print(f"step {self.global_step:3d} loss {loss.item():.4f} recons {recons_loss.item():.4f} "
                  f"usage {int(m['usage'])}/{self.hparams.k_bins} restarted {int(m['restarted'])} "
                  f"entropy {m['entropy'].item():.2f}")
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        k_before = self.bottleneck.k.clone()
        x_out, commit_loss, _ = self(x)
        assert torch.equal(k_before, self.bottleneck.k)
        self.log("val/recons", F.mse_loss(x_out, x), prog_bar=True)

    def on_validation_epoch_end(self):
        print(f"  [val @ step {self.global_step}] recons {self.trainer.callback_metrics['val/recons'].item():.4f}")

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, betas=(0.9, 0.999), weight_decay=0.0)
        warm = lambda step: min(1.0, (step + 1) / self.hparams.warmup)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warm)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def synthetic_audio(n, T=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T).float()
    freqs = torch.tensor([0.02, 0.05, 0.09, 0.13])
    idx = torch.randint(0, 4, (n, 2), generator=g)
    amp = torch.rand(n, 2, generator=g) * 0.8 + 0.2
    phase = torch.rand(n, 2, generator=g) * 2 * np.pi
    x = (amp[..., None] * torch.sin(2 * np.pi * freqs[idx][..., None] * t * 3 + phase[..., None])).sum(1)
    return (x + 0.05 * torch.randn(n, T, generator=g)).unsqueeze(1)


def main():
    L.seed_everything(0, workers=True)
    train = DataLoader(TensorDataset(synthetic_audio(1920, seed=0)), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(synthetic_audio(256, seed=1)), batch_size=128)
    model = VQVAE(lr=1e-3)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, val_check_interval=20,
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    print(f"trained {trainer.global_step} steps; live codes: "
          f"{int((model.bottleneck.k_elem >= model.bottleneck.threshold).sum())}/{model.hparams.k_bins}")


if __name__ == "__main__":
    main()
