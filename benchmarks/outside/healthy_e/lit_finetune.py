"""Transfer learning in Lightning: frozen backbone, staged unfreezing with a ``BaseFinetuning`` callback.

Modelled on Lightning's ``examples/pytorch/domain_templates/computer_vision_fine_tuning.py``
(cats-vs-dogs fine-tuning of a ResNet): a ``MilestonesFinetuning`` callback
derived from ``BaseFinetuning`` freezes the feature extractor before training
(``freeze_before_training``; BatchNorm kept frozen too, ``train_bn=False``),
unfreezes its top block at the first milestone and the rest at the second via
``unfreeze_and_add_param_group`` (new param groups with a reduced LR), the
optimizer is built only from parameters with ``requires_grad``, a MultiStepLR
schedule, and a binary head trained with ``BCEWithLogitsLoss``.

No pretrained weights can be downloaded, so the program first pre-trains the
backbone itself on a related 4-class "source" task (20 steps), then transfers
it to a binary "target" task: 5 epochs x 10 steps = 50 fine-tuning steps, with
``EarlyStopping`` on the validation loss and ``ModelCheckpoint`` keeping the
best model, which is reloaded for the final test.
"""
import argparse
import tempfile

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import BaseFinetuning, EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
L.seed_everything(21, workers=True)


def make_images(n, seed):
    """4 shape classes (band orientation x brightness polarity) on 16x16 images."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) * 0.7
    sign = torch.where(y % 2 == 0, 1.0, -1.0)[:, None, None, None]
    band = torch.zeros(n, 1, 16, 16)
    horiz = y < 2
    band[horiz, :, 5:11, :] = 1.0
    band[~horiz, :, :, 5:11] = 1.0
    x += sign * band
    return x, y


def backbone():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )


class SourceClassifier(L.LightningModule):
    """Stand-in for ImageNet pre-training: learns the 4-class source task."""

    def __init__(self):
        super().__init__()
        self.feature_extractor = backbone()
        self.head = nn.Linear(32, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.head(self.feature_extractor(x)), y)
        self.log("pretrain_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones=(1, 3), train_bn=False):
        super().__init__()
        self.milestones = milestones
        self.train_bn = train_bn

    def freeze_before_training(self, pl_module):
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.milestones[0]:
            # unfreeze the last conv block (conv, bn, relu)
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[-5:],
                                              optimizer=optimizer, train_bn=self.train_bn)
            print(f"epoch {epoch}: unfroze top block of the backbone")
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[:-5],
                                              optimizer=optimizer, train_bn=self.train_bn)
            print(f"epoch {epoch}: unfroze the rest of the backbone")


class TransferLearningModel(L.LightningModule):
    def __init__(self, pretrained_backbone_state=None, lr=3e-3, milestones=(1, 3)):
        super().__init__()
        self.save_hyperparameters(ignore=["pretrained_backbone_state"])
        self.feature_extractor = backbone()
        if pretrained_backbone_state is not None:
            self.feature_extractor.load_state_dict(pretrained_backbone_state)
        self.fc = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
        self.loss_func = F.binary_cross_entropy_with_logits

    def forward(self, x):
        return self.fc(self.feature_extractor(x))

    def _step(self, batch, stage):
        x, y = batch
        y_logits = self(x).squeeze(-1)
        loss = self.loss_func(y_logits, y.float())
        acc = ((y_logits > 0).long() == y).float().mean()
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True)
        self.log(f"{stage}_acc", acc, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        parameters = list(self.parameters())
        trainable_parameters = list(filter(lambda p: p.requires_grad, parameters))
        print(f"configure_optimizers: {len(trainable_parameters)} of {len(parameters)} parameter tensors trainable")
        optimizer = torch.optim.Adam(trainable_parameters, lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[4], gamma=0.3)
        return [optimizer], [scheduler]


class PrintMetrics(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        groups = [f"{g['lr']:.1e}x{len(g['params'])}" for g in trainer.optimizers[0].param_groups]
        n_trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        print(f"epoch {trainer.current_epoch} train_loss {m['train_loss']:.4f} val_loss {m['val_loss']:.4f} "
              f"val_acc {m['val_acc']:.3f} trainable_params {n_trainable} param_groups {groups}")


def trainer_kwargs(**kw):
    base = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0)
    base.update(kw)
    return base


# ---- stage 1: "pre-training" on the source task (4 classes)
xs, ys = make_images(320, seed=1)
source = SourceClassifier()
L.Trainer(max_epochs=2, enable_checkpointing=False, **trainer_kwargs()).fit(
    source, DataLoader(TensorDataset(xs, ys), batch_size=32, shuffle=True))
print(f"pre-training loss (last epoch): {source.trainer.callback_metrics['pretrain_loss']:.4f}")

# ---- stage 2: fine-tune on the target task: is the band horizontal? (binary)
def target_split(n, seed):
    x, y = make_images(n, seed)
    return TensorDataset(x, (y < 2).long())


train_loader = DataLoader(target_split(320, 2), batch_size=32, shuffle=True)
val_loader = DataLoader(target_split(128, 3), batch_size=64)
test_loader = DataLoader(target_split(128, 4), batch_size=64)

model = TransferLearningModel(pretrained_backbone_state=source.feature_extractor.state_dict())
with tempfile.TemporaryDirectory() as ckpt_dir:
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, monitor="val_loss", mode="min", save_top_k=1)
    trainer = L.Trainer(
        max_epochs=5,
        callbacks=[MilestonesFinetuning(milestones=(1, 3)), EarlyStopping(monitor="val_loss", patience=2),
                   checkpoint, PrintMetrics()],
        **trainer_kwargs(),
    )
    trainer.fit(model, train_loader, val_loader)
    print(f"best checkpoint val_loss {checkpoint.best_model_score:.4f}; testing it")
    trainer.test(model, test_loader, ckpt_path="best", verbose=False)
    print(f"test_loss {trainer.callback_metrics['test_loss']:.4f} test_acc {trainer.callback_metrics['test_acc']:.3f}")
