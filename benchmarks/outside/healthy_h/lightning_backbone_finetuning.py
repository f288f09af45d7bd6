"""Transfer learning in Lightning: pre-train a small CNN on a source task, then fine-tune it on
a target task with a fresh head and a milestone-based progressive unfreezing callback.

Modelled on: Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/
computer_vision_fine_tuning.py (MilestonesFinetuning(BaseFinetuning), freeze_before_training,
finetune_function with unfreeze_and_add_param_group, MultiStepLR, only trainable params handed
to the optimizer).

Unusual but intended:
  * two Trainer.fit calls in one process: the backbone is first trained on the source task,
    then copied into a new LightningModule whose classifier head is freshly initialised;
  * during fine-tuning the backbone starts frozen (only BatchNorm layers and the head train);
    at epoch 1 the last conv block is unfrozen and added to the optimizer as a new param group
    with lr/10, at epoch 2 the rest of the backbone follows -- so the optimizer's param groups
    and the set of parameters receiving gradients grow mid-run;
  * validation runs in the middle of each epoch as well as at its end (val_check_interval=0.5).
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import BaseFinetuning
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def conv_block(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                         nn.MaxPool2d(2))


def make_backbone():
    return nn.Sequential(conv_block(1, 16), conv_block(16, 32), conv_block(32, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


def make_images(n, gen, size=16):
    """Random circles/squares/crosses; returns image, shape label (source task), size label (target task)."""
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    cx, cy = torch.randint(3, size - 3, (2, n, 1, 1), generator=gen)
    r = torch.randint(1, 5, (n, 1, 1), generator=gen)
    shape = torch.randint(0, 3, (n,), generator=gen)
    circle = (xx - cx) ** 2 + (yy - cy) ** 2 <= r ** 2
    square = ((xx - cx).abs() <= r) & ((yy - cy).abs() <= r)
    cross = (((xx - cx).abs() <= 0) & ((yy - cy).abs() <= r)) | (((yy - cy).abs() <= 0) & ((xx - cx).abs() <= r))
    s = shape.view(n, 1, 1)
    img = torch.where(s == 0, circle, torch.where(s == 1, square, cross)).float()
    img = img + 0.2 * torch.randn(img.shape, generator=gen)
    return img.unsqueeze(1), shape, r.view(n) - 1


class Classifier(L.LightningModule):
    def __init__(self, n_classes, lr=3e-3, backbone=None, milestones=(1, 2)):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.feature_extractor = backbone if backbone is not None else make_backbone()
        self.fc = nn.Linear(64, n_classes)

    def forward(self, x):
        return self.fc(self.feature_extractor(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc)

    def on_validation_epoch_end(self):
        n_trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        print(f"  epoch {self.current_epoch} step {self.global_step:3d}: val_acc "
              f"{self.trainer.callback_metrics['val_acc']:.3f}  trainable params {n_trainable}")

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(self.hparams.milestones) or [10**6],
                                                     gamma=0.5)
        return [opt], [sched]


class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones=(1, 2), train_bn=True):
        super().__init__()
        self.milestones, self.train_bn = milestones, train_bn

    def freeze_before_training(self, pl_module):
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[2], optimizer=optimizer,
                                              train_bn=self.train_bn)
            print(f"epoch {epoch}: unfroze last conv block ({len(optimizer.param_groups)} param groups)")
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[:2], optimizer=optimizer,
                                              train_bn=self.train_bn)
            print(f"epoch {epoch}: unfroze the rest of the backbone ({len(optimizer.param_groups)} param groups)")


def trainer(**kw):
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def main():
    L.seed_everything(7)
    gen = torch.Generator().manual_seed(7)
    x, shape, size = make_images(1536, gen)
    xv, shape_v, size_v = make_images(512, gen)

    # 1) "pre-training" on the source task (shape classification): 20 steps
    src = Classifier(n_classes=3, milestones=())
    trainer(max_steps=20, val_check_interval=10).fit(
        src, DataLoader(TensorDataset(x[:1280], shape[:1280]), batch_size=64, shuffle=True),
        DataLoader(TensorDataset(xv, shape_v), batch_size=256))

    # 2) transfer: same backbone weights, new randomly initialised head for the size task
    tgt = Classifier(n_classes=4, lr=1e-2, backbone=src.feature_extractor, milestones=(1, 2))
    trainer(max_epochs=4, val_check_interval=0.5, callbacks=[MilestonesFinetuning((1, 2))]).fit(
        tgt, DataLoader(TensorDataset(x[1280:], size[1280:]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(xv, size_v), batch_size=256))


if __name__ == "__main__":
    main()
