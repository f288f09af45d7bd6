"""Incremental-data training with shrink-perturb warm starts, in PyTorch Lightning.

Modelled on: JordanAsh/warm_start ``run.py`` (Ash & Adams, "On Warm-Starting Neural Network
Training", NeurIPS 2020).  Data arrive in rounds (``--n_samples`` new examples per round); at
the start of every round the network is replaced by ``shrink_perturb(net, shrink=0.4,
perturb=0.1)``, which builds a *freshly initialised* network and overwrites its parameters with
``shrink * old + perturb * fresh`` ("using a randomly-initialized model as a noise source
respects how different kinds of parameters are often initialized differently"), a new Adam
optimizer is created (this happens before the very first round as well, exactly as in
``run.py``), and training runs until the training accuracy reaches 99% (capped here
by ``max_steps``), after which the held-out accuracy is reported.  The reference's plain loop
is expressed as one ``Trainer.fit`` per round, a ``LightningDataModule`` that grows, and a
callback that stops the round at the accuracy threshold.

Unusual (but intended) things about the loop:
* every round swaps ``pl_module.net`` for a *new* module object whose weights are a shrunk
  copy of the old ones plus noise, so the loss jumps up and the held-out accuracy drops right
  after each warm start before recovering;
* a fresh ``Trainer`` and a fresh optimizer per round (optimizer state is discarded on
  purpose), while ``global_step`` restarts at 0 in every round;
* the training set is a growing subset sampled with ``SubsetRandomSampler``; a round ends
  early when the epoch's train accuracy reaches 0.99.
"""
import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)

N_FEATURES, N_CLASSES = 24, 5


class mlp(nn.Module):
    def __init__(self, n_in=N_FEATURES, num_classes=N_CLASSES):
        super().__init__()
        self.lm1 = nn.Linear(n_in, 100)
        self.lm2 = nn.Linear(100, 100)
        self.lm3 = nn.Linear(100, num_classes)

    def forward(self, x):
        return self.lm3(F.relu(self.lm2(F.relu(self.lm1(x)))))


def shrink_perturb(net, shrink, perturb):
    # a randomly-initialised model as noise source respects per-layer init scales
    new_init = mlp()
    for p1, p2 in zip(new_init.parameters(), net.parameters()):
        p1.data = (shrink * p2.data + perturb * p1.data).clone()
    return new_init


def make_data(n, seed):
    """Labels from a fixed random 'teacher' network, 5 classes, some label noise."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.Generator().manual_seed(1234)
    w1 = torch.randn(N_FEATURES, 32, generator=teacher)
    w2 = torch.randn(32, N_CLASSES, generator=teacher)
    x = torch.randn(n, N_FEATURES, generator=g)
    y = (torch.tanh(x @ w1 / N_FEATURES ** 0.5) @ w2).argmax(-1)
    flip = torch.rand(n, generator=g) < 0.05
    y[flip] = torch.randint(0, N_CLASSES, (int(flip.sum()),), generator=g)
    return x, y


class GrowingDataModule(L.LightningDataModule):
    def __init__(self, n_samples=192, batch_size=64):
        super().__init__()
        self.n_samples, self.batch_size = n_samples, batch_size
        self.train_set = TensorDataset(*make_data(3 * n_samples, seed=0))
        self.val_set = TensorDataset(*make_data(1000, seed=1))
        self.order = np.random.RandomState(0).permutation(len(self.train_set))
        self.n_train = 0

    def add_round(self):
        self.n_train = min(self.n_train + self.n_samples, len(self.train_set))

    def train_dataloader(self):
        current = self.order[: self.n_train].tolist()
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=SubsetRandomSampler(current))

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=500)


class WarmStartClassifier(L.LightningModule):
    def __init__(self, lr=1e-3, decay=0.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = mlp()
        self._correct = self._seen = 0
        self.last_train_acc = 0.0

    def forward(self, x):
        return self.net(x)

    def on_train_epoch_start(self):
        self._correct = self._seen = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self._correct += (logits.argmax(-1) == y).sum().item()
        self._seen += len(y)
        self.log("train_loss", loss, on_step=True)
        return loss

    def on_train_epoch_end(self):
        self.last_train_acc = self._correct / max(self._seen, 1)
        self.log("train_acc", self.last_train_acc)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.decay)


class StopAtTrainAccuracy(L.Callback):
    """'train until reaching 99% training accuracy'"""

    def __init__(self, threshold=0.99):
        self.threshold = threshold

    def on_train_epoch_end(self, trainer, pl_module):
        acc = trainer.callback_metrics.get("train_acc")
        if acc is not None and acc >= self.threshold:
            trainer.should_stop = True


def main():
    dm = GrowingDataModule()
    model = WarmStartClassifier(lr=3e-3)
    total_steps = 0
    for rnd in range(3):
        dm.add_round()
        model.net = shrink_perturb(model.net, shrink=0.4, perturb=0.1)
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=100, max_steps=20,
                            callbacks=[StopAtTrainAccuracy(0.99)], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0,
                            check_val_every_n_epoch=1000)
        before = trainer.validate(model, datamodule=dm, verbose=False)[0]
        trainer.fit(model, datamodule=dm)
        after = trainer.validate(model, datamodule=dm, verbose=False)[0]
        total_steps += trainer.global_step
        print(f"round {rnd}: n_train={dm.n_train:4d} steps={trainer.global_step:2d} "
              f"train_acc={model.last_train_acc:.3f}  val_acc after shrink-perturb {before['val_acc']:.3f} "
              f"-> after training {after['val_acc']:.3f}  (val_loss {after['val_loss']:.3f})")
    print(f"total optimizer steps: {total_steps}")


if __name__ == "__main__":
    main()
