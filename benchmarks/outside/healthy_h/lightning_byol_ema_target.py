"""BYOL self-supervised pre-training in Lightning: EMA target network updated by a callback,
and an online linear probe trained on detached features by a second callback.

Modelled on: Lightning-Universe/lightning-bolts src/pl_bolts/models/self_supervised/byol/
byol_module.py (online/target SiameseArm, symmetric cosine loss), src/pl_bolts/callbacks/
byol_updates.py (BYOLMAWeightUpdate, cosine tau schedule) and src/pl_bolts/callbacks/
ssl_online.py (SSLOnlineEvaluator: linear head with its own optimizer on detached features).

Unusual but intended:
  * the target network is a deepcopy with requires_grad=False; it is never touched by the
    optimizer, only by an exponential moving average of the online weights after each batch
    (manual parameter update), with tau annealed from 0.99 towards 1.0;
  * the target's BatchNorm running statistics are updated by its own forward passes;
  * a separate linear probe with its *own* Adam optimizer is stepped inside a callback, outside
    Lightning's optimisation loop, on detached features;
  * validation (probe accuracy) runs twice per epoch (val_check_interval=0.5).
"""
import copy
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def mlp(d_in, d_hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.BatchNorm1d(d_hidden), nn.ReLU(inplace=True),
                         nn.Linear(d_hidden, d_out))


class SiameseArm(nn.Module):
    def __init__(self, d_in=64, d_repr=128, d_proj=64, d_hidden=256):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 256), nn.BatchNorm1d(256), nn.ReLU(inplace=True),
                                     nn.Linear(256, d_repr), nn.ReLU(inplace=True))
        self.projector = mlp(d_repr, d_hidden, d_proj)
        self.predictor = mlp(d_proj, d_hidden, d_proj)

    def forward(self, x):
        y = self.encoder(x)
        z = self.projector(y)
        return y, z, self.predictor(z)


def augment(x):
    scale = 1 + 0.2 * torch.randn(x.shape[0], 1)
    mask = (torch.rand_like(x) > 0.2).float()
    return (x * scale + 0.3 * torch.randn_like(x)) * mask


class BYOL(L.LightningModule):
    def __init__(self, lr=2e-3, weight_decay=1e-5, warmup_steps=5, max_steps=40):
        super().__init__()
        self.save_hyperparameters()
        self.online = SiameseArm()
        self.target = copy.deepcopy(self.online)
        for p in self.target.parameters():
            p.requires_grad_(False)

    @staticmethod
    def cosine_loss(p, z):
        return 2 - 2 * F.cosine_similarity(p, z.detach(), dim=-1).mean()

    def training_step(self, batch, batch_idx):
        x, _ = batch
        v1, v2 = augment(x), augment(x)
        _, _, p1 = self.online(v1)
        _, _, p2 = self.online(v2)
        with torch.no_grad():
            _, t1, _ = self.target(v1)
            _, t2, _ = self.target(v2)
        loss = self.cosine_loss(p1, t2) + self.cosine_loss(p2, t1)
        self.log("train_loss", loss)
        if batch_idx % 10 == 0:
            print(f"epoch {self.current_epoch} batch {batch_idx:2d} byol loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        pass  # the online probe callback does the measuring

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(self.online.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        def lr_lambda(s):
            if s < hp.warmup_steps:
                return (s + 1) / hp.warmup_steps
            return 0.5 * (1 + math.cos(math.pi * (s - hp.warmup_steps) / (hp.max_steps - hp.warmup_steps)))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class BYOLMAWeightUpdate(L.Callback):
    def __init__(self, initial_tau=0.99):
        self.initial_tau = initial_tau
        self.current_tau = initial_tau

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            for p_online, p_target in zip(pl_module.online.parameters(), pl_module.target.parameters()):
                p_target.mul_(self.current_tau).add_(p_online, alpha=1 - self.current_tau)
        k, K = trainer.global_step, trainer.estimated_stepping_batches
        self.current_tau = 1 - (1 - self.initial_tau) * (math.cos(math.pi * k / K) + 1) / 2


class OnlineLinearProbe(L.Callback):
    def __init__(self, d_repr=128, n_classes=10):
        self.d_repr, self.n_classes = d_repr, n_classes
        self.correct = self.total = 0

    def setup(self, trainer, pl_module, stage):
        self.probe = nn.Linear(self.d_repr, self.n_classes)
        self.opt = torch.optim.Adam(self.probe.parameters(), lr=1e-2)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        x, y = batch
        encoder = pl_module.online.encoder
        encoder.eval()  # like bolts' set_training(pl_module, False): keep BN stats untouched
        with torch.no_grad():
            feats = encoder(x).detach()
        encoder.train()
        loss = F.cross_entropy(self.probe(feats), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        with torch.no_grad():
            pred = self.probe(pl_module.online.encoder(x)).argmax(1)
        self.correct += (pred == y).sum().item()
        self.total += y.numel()

    def on_validation_epoch_end(self, trainer, pl_module):
        acc = self.correct / max(self.total, 1)
        pl_module.log("val_probe_acc", acc)
        print(f"  [val @ global_step {trainer.global_step}] online probe acc {acc:.3f}")
        self.correct = self.total = 0


def make_data(n, protos, gen):
    y = torch.randint(0, protos.shape[0], (n,), generator=gen)
    return protos[y] + 2.5 * torch.randn(n, protos.shape[1], generator=gen), y


def main():
    L.seed_everything(3)
    gen = torch.Generator().manual_seed(3)
    protos = torch.randn(10, 64, generator=gen)
    x_tr, y_tr = make_data(20 * 128, protos, gen)
    x_va, y_va = make_data(1024, protos, gen)
    train_dl = DataLoader(TensorDataset(x_tr, y_tr), batch_size=128, shuffle=True, drop_last=True)
    val_dl = DataLoader(TensorDataset(x_va, y_va), batch_size=512)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, val_check_interval=0.5, num_sanity_val_steps=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[BYOLMAWeightUpdate(), OnlineLinearProbe()])
    trainer.fit(BYOL(max_steps=40), train_dl, val_dl)


if __name__ == "__main__":
    main()
