"""BYOL self-supervised learning in Lightning with an EMA target network and an online linear probe.

Modelled on the Lightning Bolts implementation of BYOL
(``pl_bolts/models/self_supervised/byol/byol_module.py`` with the
``BYOLMAWeightUpdate`` callback; Grill et al., 2020): an online network
(encoder -> projector -> predictor) and a target network (encoder -> projector)
that is a frozen deep copy of the online one, updated after every training
batch by an exponential moving average whose ``tau`` follows the cosine
schedule ``1 - (1 - tau_base) * (cos(pi * k / K) + 1) / 2``; symmetric
``2 - 2 cos`` regression loss between the online predictions and the target
projections (computed without gradient).

As with Bolts' ``SSLOnlineEvaluator``, a linear classifier is trained online on
*detached* encoder features so representation quality can be monitored without
leaking labels into the encoder; validation reports the BYOL loss and probe
accuracy in eval mode.  Synthetic oriented-stripe textures, 4 classes; 3 epochs
x 16 batches = 48 optimizer steps (LARS replaced by AdamW + cosine schedule).
"""
import argparse
import copy
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
L.seed_everything(11, workers=True)


def make_textures(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    ang = y.float() * (torch.pi / 4) + torch.randn(n, generator=g) * 0.1
    phase = torch.rand(n, generator=g) * 6.28
    proj = xx[None] * torch.cos(ang)[:, None, None] + yy[None] * torch.sin(ang)[:, None, None]
    x = torch.sin(proj + phase[:, None, None]) + 0.3 * torch.randn(n, 16, 16, generator=g)
    return TensorDataset(x.unsqueeze(1), y)


def augment(x):
    n = x.size(0)
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    dy, dx = torch.randint(0, 5, (2,)).tolist()
    out = padded[:, :, dy:dy + 16, dx:dx + 16]
    out = out * (0.7 + 0.6 * torch.rand(n, 1, 1, 1)) + 0.2 * torch.randn(n, 1, 1, 1)
    return out + 0.1 * torch.randn_like(out)


def mlp(in_dim, hidden, out_dim):
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                         nn.Linear(hidden, out_dim))


class SiameseArm(nn.Module):
    def __init__(self, feat_dim=64, hidden=128, proj_dim=32):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, feat_dim, 3, padding=1, stride=2), nn.BatchNorm2d(feat_dim), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.projector = mlp(feat_dim, hidden, proj_dim)
        self.predictor = mlp(proj_dim, hidden, proj_dim)

    def forward(self, x):
        y = self.encoder(x)
        z = self.projector(y)
        h = self.predictor(z)
        return y, z, h


class BYOLMAWeightUpdate(L.Callback):
    """Weight update rule from BYOL: target = tau * target + (1 - tau) * online."""

    def __init__(self, initial_tau=0.99):
        super().__init__()
        self.initial_tau = initial_tau
        self.current_tau = initial_tau

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.update_weights(pl_module.online_network, pl_module.target_network)
        self.current_tau = self.update_tau(pl_module, trainer)

    def update_tau(self, pl_module, trainer):
        max_steps = trainer.estimated_stepping_batches
        return 1 - (1 - self.initial_tau) * (math.cos(math.pi * trainer.global_step / max_steps) + 1) / 2

    @torch.no_grad()
    def update_weights(self, online_net, target_net):
        for (name, online_p), (_, target_p) in zip(online_net.named_parameters(), target_net.named_parameters()):
            target_p.data = self.current_tau * target_p.data + (1 - self.current_tau) * online_p.data


class BYOL(L.LightningModule):
    def __init__(self, learning_rate=2e-3, weight_decay=1e-5, num_classes=4):
        super().__init__()
        self.save_hyperparameters()
        self.online_network = SiameseArm()
        self.target_network = copy.deepcopy(self.online_network)
        for p in self.target_network.parameters():
            p.requires_grad = False
        self.online_probe = nn.Linear(64, num_classes)

    def forward(self, x):
        y, _, _ = self.online_network(x)
        return y

    @staticmethod
    def regression_loss(h, z):
        return 2 - 2 * F.cosine_similarity(h, z.detach(), dim=-1).mean()

    def shared_step(self, img):
        img_1, img_2 = augment(img), augment(img)
        y1, _, h1 = self.online_network(img_1)
        _, _, h2 = self.online_network(img_2)
        with torch.no_grad():
            _, z1, _ = self.target_network(img_1)
            _, z2, _ = self.target_network(img_2)
        loss = self.regression_loss(h1, z2) + self.regression_loss(h2, z1)
        return loss, y1

    def training_step(self, batch, batch_idx):
        img, label = batch
        byol_loss, feats = self.shared_step(img)
        probe_logits = self.online_probe(feats.detach())  # probe does not train the encoder
        probe_loss = F.cross_entropy(probe_logits, label)
        self.log_dict({"train_loss": byol_loss, "probe_loss": probe_loss}, on_step=False, on_epoch=True)
        return byol_loss + probe_loss

    def validation_step(self, batch, batch_idx):
        img, label = batch
        byol_loss, _ = self.shared_step(img)
        probe_acc = (self.online_probe(self(img)).argmax(1) == label).float().mean()
        self.log_dict({"val_loss": byol_loss, "val_probe_acc": probe_acc})

    def configure_optimizers(self):
        params = list(self.online_network.parameters()) + list(self.online_probe.parameters())
        optimizer = torch.optim.AdamW(params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PrintMetrics(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        tau = next(c for c in trainer.callbacks if isinstance(c, BYOLMAWeightUpdate)).current_tau
        print(f"epoch {trainer.current_epoch} step {trainer.global_step} tau {tau:.4f} "
              f"train_loss {m['train_loss']:.4f} probe_loss {m['probe_loss']:.4f} "
              f"val_loss {m['val_loss']:.4f} val_probe_acc {m['val_probe_acc']:.3f}")


train_loader = DataLoader(make_textures(1024, 1), batch_size=64, shuffle=True, drop_last=True)
val_loader = DataLoader(make_textures(256, 2), batch_size=128)

model = BYOL()
trainer = L.Trainer(
    max_epochs=3,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    callbacks=[BYOLMAWeightUpdate(initial_tau=0.99), PrintMetrics()],
)
trainer.fit(model, train_loader, val_loader)
