"""Step-based LR milestones stepped once per *epoch* (Lightning's default interval).

Bug class: LR scheduler granularity mismatch.

Modelled on: galilai-group/stable-worldmodel#280 "Training scripts use
step-based LR scheduler horizons with interval='epoch'" and
Lightning-AI/pytorch-lightning#5584 "How to we update the learning on every
step?" -- a scheduler whose horizon/milestones are computed in optimizer steps
is returned from ``configure_optimizers`` without ``"interval": "step"``.
Lightning then calls ``scheduler.step()`` once per epoch, so the schedule runs
``len(train_dataloader)`` times too slowly.

What goes wrong: the LR is supposed to be cut 10x at optimizer step 20 and again
at step 36 (MultiStepLR with milestones given in steps).  With the default
``interval="epoch"`` the scheduler has only been stepped 2 times by step 20,
so the decay never happens during the run: training continues at the peak LR,
the loss stays noisy/high but nothing errors.

Healthy twin: returns the scheduler config with ``"interval": "step"``.

Onset: the first optimizer step that should run at the decayed LR is K = 20.
"""
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)

D, C = 24, 5
N_TRAIN = 256
BATCH = 32                 # 8 optimizer steps per epoch
MAX_EPOCHS = 6             # 48 optimizer steps
MILESTONES = [20, 36]      # in optimizer steps


def make_loader():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(N_TRAIN, D, generator=gen)
    w = torch.randn(D, C, generator=gen)
    y = (x @ w + 0.8 * torch.randn(N_TRAIN, C, generator=gen)).argmax(1)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(11))


class Classifier(L.LightningModule):
    def __init__(self, lr=0.2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, C))
        self.onset_reported = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        step = self.global_step
        if not HEALTHY and step == MILESTONES[0] and not self.onset_reported:
            self.onset_reported = True
            print(f"ONSET step {step}")
        if step % 4 == 0:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            print(f"step {step:3d} loss {loss.item():.4f} lr {lr:.4g}")
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=MILESTONES, gamma=0.1)
        if HEALTHY:
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return {"optimizer": optimizer, "lr_scheduler": scheduler}  # BUG: interval defaults to "epoch"


trainer = L.Trainer(
    max_epochs=MAX_EPOCHS,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
model = Classifier()
trainer.fit(model, train_dataloaders=make_loader())
print(f"finished at global_step {trainer.global_step}")
print("done")
