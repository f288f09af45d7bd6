"""Lightning manual optimization implementing Sharpness-Aware Minimization (SAM).

Modelled on davda54/sam (the widely used PyTorch SAM implementation: a
``first_step`` that climbs to ``w + rho * g / ||g||``, a second forward/backward
at the perturbed weights, a ``second_step`` that restores ``w`` and applies the
base optimizer; BatchNorm running stats are frozen during the second pass via
its ``disable_running_stats``/``enable_running_stats`` helpers) and on its
Lightning usage with ``automatic_optimization = False``, ``self.manual_backward``
and a manually stepped scheduler (Lightning docs, "Manual Optimization").

Unusual about the loop: two forward/backward passes per optimizer step; between
them the weights are moved in-place to an adversarial point, and the gradient
actually applied is the one computed there, not at the current weights.  The
BatchNorm momentum is set to 0 for the second pass so running statistics only
see the clean pass.  6 epochs x 10 steps = 60 SGD steps.
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, TensorDataset


def disable_running_stats(model):
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.backup_momentum = m.momentum
            m.momentum = 0


def enable_running_stats(model):
    for m in model.modules():
        if isinstance(m, _BatchNorm) and hasattr(m, "backup_momentum"):
            m.momentum = m.backup_momentum


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 5, generator=torch.Generator().manual_seed(99))
    logits = torch.tanh(x @ w) @ torch.randn(5, 4, generator=torch.Generator().manual_seed(98)) * 3
    y = logits.argmax(1)
    flip = torch.rand(n, generator=g) < 0.1  # label noise
    y = torch.where(flip, torch.randint(0, 4, (n,), generator=g), y)
    return TensorDataset(x, y)


class SAMClassifier(L.LightningModule):
    def __init__(self, rho=0.05, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(20, 128), nn.BatchNorm1d(128), nn.ReLU(),
                                 nn.Linear(128, 128), nn.BatchNorm1d(128), nn.ReLU(),
                                 nn.Linear(128, 4))

    def forward(self, x):
        return self.net(x)

    @torch.no_grad()
    def _first_step(self, opt):
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        grad_norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
        scale = self.hparams.rho / (grad_norm + 1e-12)
        for p in params:
            e_w = p.grad * scale
            p.add_(e_w)
            opt.state[p]["sam_e_w"] = e_w

    @torch.no_grad()
    def _restore(self, opt):
        for g in opt.param_groups:
            for p in g["params"]:
                if "sam_e_w" in opt.state[p]:
                    p.sub_(opt.state[p].pop("sam_e_w"))

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch

        enable_running_stats(self.net)
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        self._first_step(opt)

        disable_running_stats(self.net)
        loss_adv = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss_adv)
        self._restore(opt)
        opt.step()
        enable_running_stats(self.net)

        self.log_dict({"train_loss": loss, "sharp_loss": loss_adv}, on_step=False, on_epoch=True)

    def on_train_epoch_end(self):
        self.lr_schedulers().step()
        m = self.trainer.callback_metrics
        print(f"epoch {self.current_epoch} train_loss {m['train_loss']:.4f} sharp_loss {m['sharp_loss']:.4f} "
              f"val_acc {m.get('val_acc', float('nan')):.3f}")

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)]


def main():
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    train = DataLoader(make_data(640, 1), batch_size=64, shuffle=True)
    val = DataLoader(make_data(400, 2), batch_size=200)
    trainer = L.Trainer(max_epochs=6, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(SAMClassifier(), train, val)


if __name__ == "__main__":
    main()
