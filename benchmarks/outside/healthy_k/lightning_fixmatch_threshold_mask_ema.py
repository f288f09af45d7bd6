"""FixMatch semi-supervised classification in Lightning, with an EMA model for evaluation.

Modelled on: kekmodel/FixMatch-pytorch ``train.py`` (Sohn et al., "FixMatch", NeurIPS 2020):
``interleave`` / ``de_interleave`` of labelled + weak + strong batches through a single
forward pass, pseudo-labels from ``softmax(logits_u_w.detach() / T)`` with
``mask = max_probs.ge(threshold)``, ``Lu = (CE(logits_u_s, targets_u) * mask).mean()``,
SGD-Nesterov with no weight decay on ``bias``/``bn`` parameters,
``get_cosine_schedule_with_warmup(num_cycles=7/16)``, ``models/ema.py`` ``ModelEMA``
(parameters averaged, buffers copied) used for testing, ``mu`` unlabelled batches per
labelled batch.

What is unusual about the loop (all on purpose):
  * with threshold 0.95 the confidence mask is all zero early on, so the unlabelled term
    is exactly 0 (no gradient from 96 of the 112 images) until the model gets confident;
  * the pseudo-label targets come from the same forward pass, detached;
  * the EMA copy is a frozen sub-module (``requires_grad=False``, kept in eval mode, so
    Lightning warns about modules in eval mode), excluded from the optimizer, updated
    after every optimizer step (decay 0.9 for this short run; the repo uses 0.999), and
    is validated next to the raw model;
  * two loaders of different length are combined (labelled one re-sampled with
    replacement), lr warms up from 0, validation happens mid-epoch.
"""
import copy
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.utilities import CombinedLoader
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset, RandomSampler

torch.set_num_threads(1)
L.seed_everything(5, verbose=False)
NUM_CLASSES = 4


def make_glyphs(n, seed):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    imgs = torch.zeros(n, 3, 16, 16)
    for i, lab in enumerate(labels.tolist()):
        cy, cx = (5 + 6 * torch.rand(2, generator=g)).tolist()
        dy, dx = yy - cy, xx - cx
        masks = [((dy ** 2 + dx ** 2).sqrt() - 3.5).abs() < 1.0, (dy.abs().maximum(dx.abs()) - 3.5).abs() < 1.0,
                 ((dy.abs() < 1) & (dx.abs() < 4.5)) | ((dx.abs() < 1) & (dy.abs() < 4.5)),
                 ((dy - dx).abs() < 1.2) & (dy.abs() < 4.5)]
        imgs[i] = masks[lab].float() * (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g))
    return imgs, labels


def weak_aug(x):
    x = torch.roll(x, shifts=torch.randint(-2, 3, (2,)).tolist(), dims=(1, 2))
    return x.flip(-1) if torch.rand(()) < 0.5 else x


def strong_aug(x):
    x = weak_aug(x) * (0.3 + 1.4 * torch.rand(3, 1, 1))
    cy, cx = torch.randint(0, 16, (2,)).tolist()
    x = x.clone()
    x[:, max(0, cy - 3): cy + 3, max(0, cx - 3): cx + 3] = 0.5  # Cutout, as in RandAugmentMC
    return x + 0.1 * torch.randn_like(x)


class LabeledSet(Dataset):
    def __init__(self, x, y, train=True):
        self.x, self.y, self.train = x, y, train

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return (weak_aug(self.x[i]) if self.train else self.x[i]), self.y[i]


class UnlabeledSet(Dataset):
    """TransformFixMatch: returns (weak, strong) views; the true label is never used."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return weak_aug(self.x[i]), strong_aug(self.x[i])


def interleave(x, size):
    s = list(x.shape)
    return x.reshape([-1, size] + s[1:]).transpose(0, 1).reshape([-1] + s[1:])


def de_interleave(x, size):
    s = list(x.shape)
    return x.reshape([size, -1] + s[1:]).transpose(0, 1).reshape([-1] + s[1:])


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, num_cycles=7.0 / 16.0):
    def _lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        no_progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, math.cos(math.pi * num_cycles * no_progress))
    return LambdaLR(optimizer, _lr_lambda)


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.LeakyReLU(0.1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, NUM_CLASSES))


class FixMatch(L.LightningModule):
    def __init__(self, mu=3, threshold=0.95, T=1.0, lambda_u=1.0, lr=0.05, wdecay=5e-4,
                 warmup=4, total_steps=40, ema_decay=0.9):
        super().__init__()
        self.save_hyperparameters()
        self.model = small_cnn()
        self.ema_model = copy.deepcopy(self.model).eval()
        for p in self.ema_model.parameters():
            p.requires_grad_(False)
        self.param_keys = [k for k, _ in self.ema_model.named_parameters()]
        self.buffer_keys = [k for k, _ in self.ema_model.named_buffers()]

    def training_step(self, batch, batch_idx):
        (inputs_x, targets_x), (inputs_u_w, inputs_u_s) = batch["x"], batch["u"]
        batch_size, size = inputs_x.shape[0], 2 * self.hparams.mu + 1
        inputs = interleave(torch.cat((inputs_x, inputs_u_w, inputs_u_s)), size)
        logits = de_interleave(self.model(inputs), size)
        logits_x = logits[:batch_size]
        logits_u_w, logits_u_s = logits[batch_size:].chunk(2)
        Lx = F.cross_entropy(logits_x, targets_x, reduction="mean")
        pseudo_label = torch.softmax(logits_u_w.detach() / self.hparams.T, dim=-1)
        max_probs, targets_u = torch.max(pseudo_label, dim=-1)
        mask = max_probs.ge(self.hparams.threshold).float()
        Lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()
        loss = Lx + self.hparams.lambda_u * Lu
        self.log_dict({"train/loss": loss, "train/loss_x": Lx, "train/loss_u": Lu, "train/mask": mask.mean()})
        if self.global_step % 10 == 0:
            print(f"step {self.global_step}: Lx {Lx.item():.3f} Lu {Lu.item():.4f} mask {mask.mean().item():.2f}")
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # ModelEMA.update: average parameters, copy buffers (BN running stats).
        with torch.no_grad():
            msd, esd = self.model.state_dict(), self.ema_model.state_dict()
            d = self.hparams.ema_decay
            for k in self.param_keys:
                esd[k].copy_(esd[k] * d + (1.0 - d) * msd[k].detach())
            for k in self.buffer_keys:
                esd[k].copy_(msd[k])

    def validation_step(self, batch, batch_idx):
        x, y = batch
        for name, net in (("ema", self.ema_model), ("raw", self.model)):
            logits = net(x)
            self.log(f"val/{name}_acc", (logits.argmax(1) == y).float().mean(), on_epoch=True)
            self.log(f"val/{name}_loss", F.cross_entropy(logits, y), on_epoch=True)

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        if "val/ema_acc" in m and not self.trainer.sanity_checking:
            print(f"[val] step {self.global_step}: ema acc {m['val/ema_acc']:.3f}  raw acc {m['val/raw_acc']:.3f}")

    def configure_optimizers(self):
        no_decay = ["bias", "bn"]
        bn_ids = {id(p) for m in self.model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
        decay = [p for n, p in self.model.named_parameters()
                 if not any(nd in n for nd in no_decay) and id(p) not in bn_ids]
        other = [p for n, p in self.model.named_parameters()
                 if any(nd in n for nd in no_decay) or id(p) in bn_ids]
        optimizer = torch.optim.SGD([{"params": decay, "weight_decay": self.hparams.wdecay},
                                     {"params": other, "weight_decay": 0.0}],
                                    lr=self.hparams.lr, momentum=0.9, nesterov=True)
        scheduler = get_cosine_schedule_with_warmup(optimizer, self.hparams.warmup, self.hparams.total_steps)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def main():
    batch_size, mu, steps_per_epoch, epochs = 16, 3, 20, 2
    x, y = make_glyphs(1000, seed=3)
    per_class = [torch.nonzero(y == c).flatten()[:8] for c in range(NUM_CLASSES)]  # 32 labels in total
    labeled_idx = torch.cat(per_class)
    val_x, val_y = make_glyphs(200, seed=4)
    labeled = DataLoader(LabeledSet(x[labeled_idx], y[labeled_idx]), batch_size=batch_size, drop_last=True,
                         sampler=RandomSampler(range(len(labeled_idx)), replacement=True,
                                               num_samples=batch_size * steps_per_epoch))
    unlabeled = DataLoader(UnlabeledSet(x[: batch_size * mu * steps_per_epoch]), batch_size=batch_size * mu,
                           shuffle=True, drop_last=True)
    train_loader = CombinedLoader({"x": labeled, "u": unlabeled}, mode="max_size_cycle")
    val_loader = DataLoader(LabeledSet(val_x, val_y, train=False), batch_size=100)
    model = FixMatch(mu=mu, total_steps=steps_per_epoch * epochs)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, val_check_interval=10,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_loader, val_loader)
    print(f"done: {trainer.global_step} optimizer steps")


if __name__ == "__main__":
    main()
