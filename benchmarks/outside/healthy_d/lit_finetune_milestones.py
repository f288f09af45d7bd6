"""Modelled on Lightning's examples/pytorch/domain_templates/computer_vision_fine_tuning.py
(MilestonesFinetuning(BaseFinetuning) + TransferLearningModel, "cats vs dogs" transfer).

Exercises: a backbone "pre-trained" in a first Lightning run on a pretext task, saved, and
loaded into a new transfer model; BaseFinetuning.freeze(train_bn=False) before fitting, an
optimizer built only from `filter(lambda p: p.requires_grad, ...)` (just the head at
first), and unfreeze_and_add_param_group() at epoch milestones adding the top and then the
remaining backbone blocks to the optimizer as new param groups with lower LR. BatchNorm layers
of the backbone are kept in eval mode (running statistics frozen, overriding train()) while
the rest of the network trains, and their affine parameters are excluded from the optimizer.
MultiStepLR on the milestones. Synthetic 3x24x24 images: pretext label = dominant colour,
target label = shape (square vs. cross).
"""
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks.finetuning import BaseFinetuning

torch.set_num_threads(1)
L.seed_everything(0)


def make_images(n, gen):
    x = 0.2 * torch.randn(n, 3, 24, 24, generator=gen)
    colour = torch.randint(0, 3, (n,), generator=gen)
    shape = torch.randint(0, 2, (n,), generator=gen)
    for i in range(n):
        r, c = torch.randint(2, 14, (2,), generator=gen).tolist()
        if shape[i] == 0:
            x[i, colour[i], r:r + 8, c:c + 8] += 1.5
        else:
            x[i, colour[i], r + 3:r + 5, c:c + 8] += 1.5
            x[i, colour[i], r:r + 8, c + 3:c + 5] += 1.5
    return x, colour, shape


def backbone():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())


class PretextModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.feature_extractor = backbone()
        self.head = nn.Linear(32, 3)

    def training_step(self, batch, batch_idx):
        x, colour, _ = batch
        return F.cross_entropy(self.head(self.feature_extractor(x)), colour)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones: tuple = (1, 2), train_bn: bool = False):
        super().__init__()
        self.milestones = milestones
        self.train_bn = train_bn

    def freeze_before_training(self, pl_module: L.LightningModule):
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer):
        if epoch == self.milestones[0]:
            # unfreeze the last conv block
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[-5:], optimizer=optimizer,
                                              train_bn=self.train_bn)
        elif epoch == self.milestones[1]:
            # unfreeze remaining layers
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[:-5], optimizer=optimizer,
                                              train_bn=self.train_bn)


class TransferLearningModel(L.LightningModule):
    def __init__(self, backbone_ckpt: str, lr: float = 1e-2, milestones: tuple = (1, 2), freeze_bn_stats=True):
        super().__init__()
        self.save_hyperparameters()
        self.feature_extractor = backbone()
        self.feature_extractor.load_state_dict(torch.load(backbone_ckpt))
        self.fc = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        self.loss_func = F.binary_cross_entropy_with_logits

    def _freeze_bn_stats(self):
        for m in self.feature_extractor.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()  # keep the pre-trained running statistics

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.hparams.freeze_bn_stats:
            self._freeze_bn_stats()
        return self

    def on_train_epoch_start(self):
        # Lightning restores the per-module modes it captured before the sanity check, so
        # re-apply the frozen-BN policy at the start of every epoch as well
        if self.hparams.freeze_bn_stats:
            self._freeze_bn_stats()

    def forward(self, x):
        return self.fc(self.feature_extractor(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, _, y = batch
        y_logits = self(x)
        train_loss = self.loss_func(y_logits, y.float())
        self.log("train_loss", train_loss, prog_bar=True)
        return train_loss

    def validation_step(self, batch, batch_idx):
        x, _, y = batch
        y_logits = self(x)
        self.log("val_loss", self.loss_func(y_logits, y.float()), prog_bar=True)
        self.log("val_acc", ((y_logits > 0).long() == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        parameters = list(self.parameters())
        trainable_parameters = list(filter(lambda p: p.requires_grad, parameters))
        print(f"The model will start training with only {len(trainable_parameters)} "
              f"trainable parameters out of {len(parameters)}.")
        optimizer = torch.optim.Adam(trainable_parameters, lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(self.hparams.milestones), gamma=0.5)
        return [optimizer], [scheduler]

    def on_train_epoch_end(self):
        opt = self.optimizers()
        m = self.trainer.callback_metrics
        print(f"epoch {self.current_epoch}: param groups {len(opt.param_groups)} "
              f"lrs {[round(g['lr'], 5) for g in opt.param_groups]} val_acc {float(m.get('val_acc', 0)):.3f}")


gen = torch.Generator().manual_seed(0)
x, colour, shape = make_images(480, gen)
ds = torch.utils.data.TensorDataset(x, colour, shape)
pre_dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True)
train_dl = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(320)), batch_size=32, shuffle=True)
val_dl = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, range(320, 480)), batch_size=80)

# ---- stage 0: pretext pre-training of the backbone ----
pre = PretextModel()
L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
          enable_model_summary=False).fit(pre, pre_dl)
ckpt = "lit_finetune_milestones_backbone.pt"
torch.save(pre.feature_extractor.state_dict(), ckpt)

# ---- stage 1: transfer with milestone unfreezing ----
model = TransferLearningModel(backbone_ckpt=ckpt)
bn0 = model.feature_extractor[1].running_mean.clone()
trainer = L.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_progress_bar=False,
                    enable_checkpointing=False, enable_model_summary=False,
                    callbacks=[MilestonesFinetuning(milestones=model.hparams.milestones)])
trainer.fit(model, train_dl, val_dl)
print("BN running stats unchanged:", torch.equal(bn0, model.feature_extractor[1].running_mean))
os.remove(ckpt)
