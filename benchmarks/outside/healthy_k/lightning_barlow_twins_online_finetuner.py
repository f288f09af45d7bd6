"""Barlow Twins self-supervised pre-training with an online linear evaluator (Lightning).

Modelled on: the Lightning tutorial "Barlow Twins Tutorial" (Lightning-AI/tutorials,
``lightning_examples/barlow-twins/barlow_twins.py``): ``BarlowTwinsLoss`` (standardised
cross-correlation, on-diagonal ``(c_ii - 1)^2`` + ``lambda_coeff`` * off-diagonal),
``ProjectionHead`` (Linear-BN-ReLU-Linear), Adam with a per-step linear-warm-up
``LambdaLR`` (``"interval": "step"``), a data transform returning two augmented views
plus a "finetune view", and the ``OnlineFineTuner`` callback that creates its own linear
layer and Adam in ``on_fit_start`` and trains them in ``on_train_batch_end`` on detached
features.  Feature extraction for the probe is done with the encoder temporarily in eval
mode, as in lightning-bolts' ``SSLOnlineEvaluator``.

What is unusual about the loop (all on purpose):
  * two optimizers step on every batch, but only one is known to Lightning; the probe's
    Adam lives in a callback and updates a layer that the main optimizer does not hold;
  * the probe layer is attached to the LightningModule after ``configure_optimizers``,
    and receives gradients only from its own detached-feature loss;
  * the encoder is switched to eval mode and back inside each training batch (so the
    probe's forward pass does not touch BN running statistics);
  * warm-up starts at lr 0 (the first step of the main optimizer changes nothing);
    validation runs twice per epoch (``val_check_interval=0.5``).
"""
from functools import partial

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)
NUM_CLASSES = 4


def make_glyphs(n, seed):
    """3x16x16 images of 4 glyph classes (ring, square, plus, diagonal) with random colour/position."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    imgs = torch.zeros(n, 3, 16, 16)
    for i, lab in enumerate(labels.tolist()):
        cy, cx = (4 + 8 * torch.rand(2, generator=g)).tolist()
        dy, dx = yy - cy, xx - cx
        if lab == 0:
            m = ((dy ** 2 + dx ** 2).sqrt() - 3.5).abs() < 1.0
        elif lab == 1:
            m = (dy.abs().maximum(dx.abs()) - 3.5).abs() < 1.0
        elif lab == 2:
            m = ((dy.abs() < 1.0) & (dx.abs() < 4.5)) | ((dx.abs() < 1.0) & (dy.abs() < 4.5))
        else:
            m = ((dy - dx).abs() < 1.2) & (dy.abs() < 4.5)
        imgs[i] = m.float() * (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g))
    return imgs, labels


class BarlowTwinsTransform:
    """Two random views for the SSL loss plus a lightly processed 'finetune view'."""

    def augment(self, x):
        shift = torch.randint(-3, 4, (2,)).tolist()
        x = torch.roll(x, shifts=shift, dims=(1, 2))
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        x = x * (0.6 + 0.8 * torch.rand(3, 1, 1))  # colour jitter
        if torch.rand(()) < 0.2:
            x = x.mean(0, keepdim=True).expand(3, -1, -1)  # random grayscale
        return x + 0.05 * torch.randn_like(x)

    def __call__(self, x):
        return self.augment(x), self.augment(x), x


class AugmentedDataset(Dataset):
    def __init__(self, imgs, labels, transform):
        self.imgs, self.labels, self.transform = imgs, labels, transform

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return self.transform(self.imgs[i]), self.labels[i]


class BarlowTwinsLoss(nn.Module):
    def __init__(self, batch_size, lambda_coeff=5e-3, z_dim=64):
        super().__init__()
        self.batch_size, self.lambda_coeff, self.z_dim = batch_size, lambda_coeff, z_dim

    @staticmethod
    def off_diagonal_ele(x):
        n, m = x.shape
        assert n == m
        return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()

    def forward(self, z1, z2):
        z1_norm = (z1 - torch.mean(z1, dim=0)) / torch.std(z1, dim=0)
        z2_norm = (z2 - torch.mean(z2, dim=0)) / torch.std(z2, dim=0)
        cross_corr = torch.matmul(z1_norm.T, z2_norm) / self.batch_size
        on_diag = torch.diagonal(cross_corr).add_(-1).pow_(2).sum()
        off_diag = self.off_diagonal_ele(cross_corr).pow_(2).sum()
        return on_diag + self.lambda_coeff * off_diag


def encoder_net(out_dim=64):
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, out_dim, 3, padding=1), nn.BatchNorm2d(out_dim), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())


class ProjectionHead(nn.Module):
    def __init__(self, input_dim=64, hidden_dim=128, output_dim=64):
        super().__init__()
        self.projection_head = nn.Sequential(nn.Linear(input_dim, hidden_dim, bias=True), nn.BatchNorm1d(hidden_dim),
                                             nn.ReLU(), nn.Linear(hidden_dim, output_dim, bias=False))

    def forward(self, x):
        return self.projection_head(x)


def fn(warmup_steps, step):
    return float(step) / float(max(1, warmup_steps)) if step < warmup_steps else 1.0


def linear_warmup_decay(warmup_steps):
    return partial(fn, warmup_steps)


class BarlowTwins(L.LightningModule):
    def __init__(self, encoder, encoder_out_dim, num_training_samples, batch_size, lambda_coeff=5e-3,
                 z_dim=64, learning_rate=2e-3, warmup_epochs=1):
        super().__init__()
        self.encoder = encoder
        self.projection_head = ProjectionHead(input_dim=encoder_out_dim, hidden_dim=128, output_dim=z_dim)
        self.loss_fn = BarlowTwinsLoss(batch_size=batch_size, lambda_coeff=lambda_coeff, z_dim=z_dim)
        self.learning_rate, self.warmup_epochs = learning_rate, warmup_epochs
        self.train_iters_per_epoch = num_training_samples // batch_size

    def forward(self, x):
        return self.encoder(x)

    def shared_step(self, batch):
        (x1, x2, _), _ = batch
        z1 = self.projection_head(self.encoder(x1))
        z2 = self.projection_head(self.encoder(x2))
        return self.loss_fn(z1, z2)

    def training_step(self, batch, batch_idx):
        loss = self.shared_step(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.shared_step(batch), on_step=False, on_epoch=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.learning_rate)
        warmup_steps = self.train_iters_per_epoch * self.warmup_epochs
        scheduler = {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(warmup_steps)),
                     "interval": "step", "frequency": 1}
        return [optimizer], [scheduler]


class OnlineFineTuner(L.Callback):
    def __init__(self, encoder_output_dim, num_classes):
        super().__init__()
        self.encoder_output_dim, self.num_classes = encoder_output_dim, num_classes

    def on_fit_start(self, trainer, pl_module):
        pl_module.online_finetuner = nn.Linear(self.encoder_output_dim, self.num_classes).to(pl_module.device)
        self.optimizer = torch.optim.Adam(pl_module.online_finetuner.parameters(), lr=1e-2)
        main_params = {id(p) for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]}
        assert not any(id(p) in main_params for p in pl_module.online_finetuner.parameters())

    def _features(self, pl_module, batch):
        (_, _, finetune_view), y = batch
        was_training = pl_module.encoder.training
        pl_module.encoder.eval()
        with torch.no_grad():
            feats = pl_module(finetune_view)
        pl_module.encoder.train(was_training)
        return feats.detach(), y

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        feats, y = self._features(pl_module, batch)
        preds = pl_module.online_finetuner(feats)
        loss = F.cross_entropy(preds, y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        pl_module.log("online_train_acc", (preds.argmax(1) == y).float().mean(), on_step=True, on_epoch=False)
        pl_module.log("online_train_loss", loss, on_step=True, on_epoch=False)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        feats, y = self._features(pl_module, batch)
        preds = pl_module.online_finetuner(feats)
        pl_module.log("online_val_acc", (preds.argmax(1) == y).float().mean(), on_step=False, on_epoch=True)
        pl_module.log("online_val_loss", F.cross_entropy(preds, y), on_step=False, on_epoch=True)


class PrintValidation(L.Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        print(f"[val] step {trainer.global_step}: ssl loss {m['val_loss']:.3f}  "
              f"online probe acc {m['online_val_acc']:.3f}")


def main():
    batch_size, encoder_out_dim = 32, 64
    train_x, train_y = make_glyphs(384, seed=1)
    val_x, val_y = make_glyphs(96, seed=2)
    transform = BarlowTwinsTransform()
    train_loader = DataLoader(AugmentedDataset(train_x, train_y, transform), batch_size=batch_size,
                              shuffle=True, drop_last=True)
    val_loader = DataLoader(AugmentedDataset(val_x, val_y, transform), batch_size=batch_size, drop_last=True)
    model = BarlowTwins(encoder=encoder_net(encoder_out_dim), encoder_out_dim=encoder_out_dim,
                        num_training_samples=len(train_x), batch_size=batch_size)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, val_check_interval=0.5,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[OnlineFineTuner(encoder_out_dim, NUM_CLASSES), PrintValidation()])
    trainer.fit(model, train_loader, val_loader)
    print(f"done: {trainer.global_step} optimizer steps")


if __name__ == "__main__":
    main()
