"""Second-order MAML on sinusoid regression as a LightningModule.

Modelled on: learnables/learn2learn ``learn2learn/algorithms/lightning/lightning_maml.py``
(``LightningMAML``: ``meta_learn`` decorated with ``@torch.enable_grad()``, the learner
is cloned and adapted with ``adaptation_steps`` inner SGD steps on the support set,
the query loss is the training loss, and the same routine runs in
``validation_step``), on the sinusoid benchmark of Finn et al. (2017): amplitude in
[0.1, 5], phase in [0, pi], 10-shot support / 10-shot query, an MLP 1-40-40-1.

What is unusual about the loop (all intentional):
  * the inner loop computes gradients with ``create_graph=True`` and builds "fast
    weights" that are not ``nn.Parameter``s; the outer Adam step differentiates
    through them (second-order MAML, Hessian-vector products);
  * validation also needs gradients (adaptation on the support set), so the
    Trainer runs with ``inference_mode=False`` and ``meta_learn`` re-enables grad;
  * the model's own parameters are never updated by the inner loop; only the outer
    optimizer changes them, once per meta-batch of tasks;
  * validation runs twice inside the single training epoch (``val_check_interval``).
"""
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


class SineTasks(Dataset):
    """Each item is one task: (x_support, y_support, x_query, y_query)."""

    def __init__(self, n_tasks, shots=10, queries=10, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.amp = torch.empty(n_tasks).uniform_(0.1, 5.0, generator=g)
        self.phase = torch.empty(n_tasks).uniform_(0.0, math.pi, generator=g)
        self.x = torch.empty(n_tasks, shots + queries, 1).uniform_(-5.0, 5.0, generator=g)
        self.shots = shots

    def __len__(self):
        return self.amp.shape[0]

    def __getitem__(self, i):
        x = self.x[i]
        y = self.amp[i] * torch.sin(x - self.phase[i])
        s = self.shots
        return x[:s], y[:s], x[s:], y[s:]


class LightningMAML(L.LightningModule):
    def __init__(self, adaptation_lr=0.01, adaptation_steps=1, meta_lr=1e-3,
                 first_order=False):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(),
                                   nn.Linear(40, 1))

    def adapt(self, params, x, y, steps, create_graph):
        for _ in range(steps):
            loss = F.mse_loss(functional_call(self.model, params, (x,)), y)
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
            params = {name: p - self.hparams.adaptation_lr * g
                      for (name, p), g in zip(params.items(), grads)}
        return params

    @torch.enable_grad()
    def meta_learn(self, batch, steps):
        xs, ys, xq, yq = batch
        params = dict(self.model.named_parameters())
        create_graph = self.training and not self.hparams.first_order
        losses = []
        for t in range(xs.shape[0]):
            fast = self.adapt(params, xs[t], ys[t], steps, create_graph)
            losses.append(F.mse_loss(functional_call(self.model, fast, (xq[t],)), yq[t]))
        return torch.stack(losses).mean()

    def training_step(self, batch, batch_idx):
        loss = self.meta_learn(batch, self.hparams.adaptation_steps)
        self.log("train_query_mse", loss, prog_bar=False)
        if batch_idx % 10 == 0:
            print(f"step {self.global_step:3d} meta-train query mse {loss.item():.3f}")
        return loss

    def validation_step(self, batch, batch_idx):
        # adapt with more steps at meta-test time, as in Finn et al.
        loss = self.meta_learn(batch, steps=5).detach()
        self.log("valid_query_mse", loss)
        return loss

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            mse = self.trainer.callback_metrics["valid_query_mse"].item()
            print(f"step {self.global_step:3d} meta-valid query mse (5 steps) {mse:.3f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.hparams.meta_lr)


def main():
    L.seed_everything(0, workers=True)
    train_loader = DataLoader(SineTasks(60 * 16, seed=1), batch_size=16, shuffle=True)
    val_loader = DataLoader(SineTasks(64, seed=2), batch_size=32)
    module = LightningMAML(adaptation_lr=0.01, adaptation_steps=1, meta_lr=5e-3)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        val_check_interval=30,
        num_sanity_val_steps=1,
        inference_mode=False,  # validation must differentiate through adaptation
        gradient_clip_val=10.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_loader, val_loader)


if __name__ == "__main__":
    main()
