"""Deep SVDD one-class anomaly detection (autoencoder pre-training + soft-boundary SVDD) in Lightning.

Modelled on: lukasruff/Deep-SVDD-PyTorch (Ruff et al., "Deep One-Class Classification", ICML
2018): ``networks/mnist_LeNet.py`` (``MNIST_LeNet`` / ``MNIST_LeNet_Autoencoder``: every conv /
linear layer has ``bias=False`` and BatchNorm has ``affine=False`` to rule out the trivial
constant "hypersphere collapse" solution), ``deepSVDD.py`` (``pretrain`` then
``init_network_weights_from_pretraining``: the encoder keys of the AE state dict are copied into
the SVDD net), and ``optim/deepSVDD_trainer.py`` (``init_center_c`` with the ``eps`` fix-up,
soft-boundary objective ``R^2 + 1/nu * mean(max(0, dist - R^2))`` and the radius updated by a
quantile, ``get_radius``, on every batch once ``warm_up_n_epochs`` are over).  One normal class
of synthetic 16x16 glyphs is trained on; the test set mixes it with four anomalous classes.

Unusual (but intended) things about the loop:
* two ``LightningModule``s and two ``Trainer.fit`` calls: the autoencoder is trained first, then
  a *different* network is built and partially loaded from it (decoder weights dropped) and gets
  a new Adam + MultiStepLR;
* the hypersphere centre ``c`` is a buffer computed once in ``on_train_start`` by an eval-mode
  pass over the training data and never trained; the radius ``R`` is a buffer overwritten from
  a distance quantile (no gradient) on every batch after the warm-up epoch, so the loss changes
  its form at that point (R jumps from 0);
* no biases, non-affine BatchNorm, Adam with ``amsgrad=True`` and weight decay 1e-6.
"""
import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)
REP_DIM = 32


class LeNetEncoder(nn.Module):
    def __init__(self, rep_dim=REP_DIM):
        super().__init__()
        self.rep_dim = rep_dim
        self.pool = nn.MaxPool2d(2, 2)
        self.conv1 = nn.Conv2d(1, 8, 5, bias=False, padding=2)
        self.bn1 = nn.BatchNorm2d(8, eps=1e-04, affine=False)
        self.conv2 = nn.Conv2d(8, 4, 5, bias=False, padding=2)
        self.bn2 = nn.BatchNorm2d(4, eps=1e-04, affine=False)
        self.fc1 = nn.Linear(4 * 4 * 4, self.rep_dim, bias=False)

    def forward(self, x):
        x = self.pool(F.leaky_relu(self.bn1(self.conv1(x))))
        x = self.pool(F.leaky_relu(self.bn2(self.conv2(x))))
        return self.fc1(x.view(x.size(0), -1))


class LeNetAutoencoder(LeNetEncoder):
    def __init__(self, rep_dim=REP_DIM):
        super().__init__(rep_dim)
        self.deconv1 = nn.ConvTranspose2d(2, 4, 5, bias=False, padding=2)
        self.bn3 = nn.BatchNorm2d(4, eps=1e-04, affine=False)
        self.deconv2 = nn.ConvTranspose2d(4, 8, 5, bias=False, padding=2)
        self.bn4 = nn.BatchNorm2d(8, eps=1e-04, affine=False)
        self.deconv3 = nn.ConvTranspose2d(8, 1, 5, bias=False, padding=2)

    def forward(self, x):
        x = super().forward(x)
        x = x.view(x.size(0), int(self.rep_dim / 16), 4, 4)
        x = F.interpolate(F.leaky_relu(x), scale_factor=2)
        x = F.interpolate(F.leaky_relu(self.bn3(self.deconv1(x))), scale_factor=2)
        x = F.leaky_relu(self.bn4(self.deconv2(x)))
        return torch.sigmoid(self.deconv3(x))


def make_glyph_data(n_per_class, classes, seed):
    templates = (torch.rand(5, 1, 16, 16, generator=torch.Generator().manual_seed(7)) > 0.6).float()
    templates = F.avg_pool2d(templates, 3, 1, 1)
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in classes:
        x = templates[c].expand(n_per_class, -1, -1, -1) + 0.1 * torch.randn(n_per_class, 1, 16, 16, generator=g)
        xs.append(x.clamp(0, 1))
        ys.append(torch.full((n_per_class,), int(c != 0)))  # label 1 = anomaly
    return torch.cat(xs), torch.cat(ys)


class OneClassData(L.LightningDataModule):
    def __init__(self, batch_size=64):
        super().__init__()
        self.batch_size = batch_size
        self.train_x, _ = make_glyph_data(640, [0], seed=0)  # normal class only
        self.test_x, self.test_y = make_glyph_data(100, [0, 1, 2, 3, 4], seed=1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.train_x), batch_size=self.batch_size, shuffle=True, drop_last=True)


class AEPretrainer(L.LightningModule):
    def __init__(self, lr=1e-3, weight_decay=1e-6):
        super().__init__()
        self.save_hyperparameters()
        self.ae_net = LeNetAutoencoder()

    def training_step(self, batch, batch_idx):
        (inputs,) = batch
        outputs = self.ae_net(inputs)
        scores = torch.sum((outputs - inputs) ** 2, dim=tuple(range(1, outputs.dim())))
        loss = torch.mean(scores)
        self.log("ae_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay, amsgrad=True)
        return [opt], [torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2], gamma=0.1)]


def get_radius(dist, nu):
    """Optimally solve for radius R via the (1-nu)-quantile of distances."""
    return np.quantile(np.sqrt(dist.clone().detach().cpu().numpy()), 1 - nu)


class DeepSVDD(L.LightningModule):
    def __init__(self, nu=0.1, lr=1e-3, weight_decay=1e-6, warm_up_n_epochs=1, eps=0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = LeNetEncoder()
        self.register_buffer("c", torch.zeros(REP_DIM))
        self.register_buffer("R", torch.tensor(0.0))

    def init_network_weights_from_pretraining(self, ae_net):
        net_dict = self.net.state_dict()
        ae_net_dict = {k: v for k, v in ae_net.state_dict().items() if k in net_dict}
        net_dict.update(ae_net_dict)
        self.net.load_state_dict(net_dict)
        print(f"copied {len(ae_net_dict)} encoder tensors from the pretrained autoencoder")

    @torch.no_grad()
    def init_center_c(self, loader):
        n_samples, c = 0, torch.zeros(REP_DIM)
        self.net.eval()
        for (inputs,) in loader:
            outputs = self.net(inputs)
            n_samples += outputs.shape[0]
            c += torch.sum(outputs, dim=0)
        self.net.train()
        c /= n_samples
        eps = self.hparams.eps
        c[(abs(c) < eps) & (c < 0)] = -eps
        c[(abs(c) < eps) & (c > 0)] = eps
        self.c.copy_(c)

    def on_train_start(self):
        self.init_center_c(self.trainer.datamodule.train_dataloader())
        print(f"center c initialised, |c| = {self.c.norm():.3f}")

    def training_step(self, batch, batch_idx):
        (inputs,) = batch
        outputs = self.net(inputs)
        dist = torch.sum((outputs - self.c) ** 2, dim=1)
        scores = dist - self.R ** 2
        loss = self.R ** 2 + (1 / self.hparams.nu) * torch.mean(torch.max(torch.zeros_like(scores), scores))
        if self.current_epoch >= self.hparams.warm_up_n_epochs:
            self.R.data = torch.tensor(get_radius(dist, self.hparams.nu), dtype=torch.float32)
        self.log("svdd_loss", loss)
        if self.global_step % 5 == 0:
            print(f"[svdd] step {self.global_step:2d} epoch {self.current_epoch} loss {loss.item():.5f} R {self.R.item():.4f}")
        return loss

    @torch.no_grad()
    def anomaly_scores(self, x):
        self.eval()
        dist = torch.sum((self.net(x) - self.c) ** 2, dim=1)
        return dist - self.R ** 2

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay, amsgrad=True)
        return [opt], [torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2], gamma=0.1)]


def roc_auc(labels, scores):
    """Mann-Whitney U formulation of AUROC (ties get half credit)."""
    labels, scores = np.asarray(labels), np.asarray(scores)
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return greater + 0.5 * ties


def make_trainer(max_epochs):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, log_every_n_steps=5)


def main():
    dm = OneClassData()
    ae = AEPretrainer()
    make_trainer(max_epochs=3).fit(ae, datamodule=dm)  # 30 steps
    print(f"AE pretraining done, final reconstruction loss {ae.trainer.callback_metrics['ae_loss']:.3f}")

    svdd = DeepSVDD(nu=0.1)
    svdd.init_network_weights_from_pretraining(ae.ae_net)
    make_trainer(max_epochs=3).fit(svdd, datamodule=dm)  # 30 steps

    scores = svdd.anomaly_scores(dm.test_x)
    auc = roc_auc(dm.test_y.numpy(), scores.numpy())
    frac_out = (scores[dm.test_y == 0] > 0).float().mean().item()
    print(f"test AUROC {auc:.3f}; normal test points outside the sphere {frac_out:.2f} (nu=0.1)")


if __name__ == "__main__":
    main()
