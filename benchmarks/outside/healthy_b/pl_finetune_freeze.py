"""Modelled on Lightning's examples/pytorch/domain_templates/computer_vision_fine_tuning.py:
MilestonesFinetuning(BaseFinetuning) freezes the backbone in freeze_before_training and
unfreeze_and_add_param_group()s it at a milestone epoch with a lower lr (train_bn=False keeps
frozen BatchNorms in eval); MultiStepLR scheduler; accumulate_grad_batches=2. A small CNN
'backbone' stands in for the pretrained ResNet; 8x8 synthetic images."""
import torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks.finetuning import BaseFinetuning
from torch.utils.data import TensorDataset, DataLoader
L.seed_everything(0)
def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g); x = torch.randn(n, 3, 8, 8, generator=g) * 0.5
    for c in range(3): x[y == c, c] += 1.0
    return TensorDataset(x, y)
class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones=(1, 2), train_bn=False):
        super().__init__(); self.milestones, self.train_bn = milestones, train_bn
    def freeze_before_training(self, pl_module): self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)
    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == self.milestones[0]:
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[-4:], optimizer=optimizer, train_bn=self.train_bn)
        elif epoch == self.milestones[1]:
            self.unfreeze_and_add_param_group(modules=pl_module.feature_extractor[:-4], optimizer=optimizer, train_bn=self.train_bn)
class TransferLearningModel(L.LightningModule):
    def __init__(self, lr=1e-2):
        super().__init__(); self.save_hyperparameters()
        self.feature_extractor = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    def forward(self, x): return self.fc(self.feature_extractor(x))
    def training_step(self, batch, batch_idx):
        x, y = batch; loss = F.cross_entropy(self(x), y); self.log("train_loss", loss); return loss
    def validation_step(self, batch, batch_idx):
        x, y = batch; self.log("val_acc", (self(x).argmax(1) == y).float().mean())
    def configure_optimizers(self):
        trainable = filter(lambda p: p.requires_grad, self.parameters())
        opt = torch.optim.Adam(trainable, lr=self.hparams.lr)
        return [opt], [torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2], gamma=0.3)]
trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, accumulate_grad_batches=2, enable_progress_bar=False,
                    logger=False, enable_checkpointing=False, callbacks=[MilestonesFinetuning()], log_every_n_steps=5)
trainer.fit(TransferLearningModel(), DataLoader(data(480, 0), batch_size=16, shuffle=True), DataLoader(data(96, 1), batch_size=48))
