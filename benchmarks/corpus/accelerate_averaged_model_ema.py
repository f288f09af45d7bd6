"""A tabular regressor trained with Accelerate, gradient accumulation and an EMA kept by ``AveragedModel``.

Modelled on: the PyTorch docs for ``torch.optim.swa_utils`` (the EMA recipe:
``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))`` updated after each
optimizer step, https://pytorch.org/docs/stable/optim.html#weight-averaging-swa-and-ema)
inside huggingface/accelerate examples/by_feature/gradient_accumulation.py.
Habits reproduced: ``Accelerator(cpu=True, gradient_accumulation_steps=...)``, model,
optimizer, loaders and schedule passed through ``prepare`` in one call, ``with
accelerator.accumulate(model):`` around forward/backward/step/zero_grad, clipping only when
``accelerator.sync_gradients``, the average built over the unwrapped model and updated
only on sync steps (once per optimizer step, not per micro-batch), a ``OneCycleLR``
stepped with the optimizer, evaluation of the live and the averaged model under
``torch.no_grad()`` each epoch, and ``update_bn`` skipped because the model has no
BatchNorm.

``--steps`` counts optimizer updates: with accumulation over 2 micro-batches the loop
reads ``2 * steps`` batches.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 12


def make_split(size: int, seed: int) -> TensorDataset:
    """Tabular rows whose target is a smooth function of a few features plus noise."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(size, FEATURES, generator=generator)
    target = (features[:, 0] * features[:, 1] + torch.sin(features[:, 2]) - 0.5 * features[:, 3]
              + 0.1 * torch.randn(size, generator=generator))
    return TensorDataset(features, target.unsqueeze(1))


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 2, dropout: float = 0.1):
        super().__init__()
        self.stem = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout))
            for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for features, target in loader:
            prediction = model(features)
            prediction, target = accelerator.gather_for_metrics((prediction, target))
            total += F.mse_loss(prediction, target, reduction="sum").item()
            count += len(target)
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="optimizer updates in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--ema_decay", type=float, default=0.95)
    args = parser.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(args.seed)
    train_loader = DataLoader(make_split(384, args.seed), batch_size=16, shuffle=True)
    eval_loader = DataLoader(make_split(64, args.seed + 100), batch_size=32)
    model = ResidualMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)
    ema_model = AveragedModel(accelerator.unwrap_model(model), multi_avg_fn=get_ema_multi_avg_fn(args.ema_decay))

    updates = 0
    while updates < args.steps:
        model.train()
        for features, target in train_loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(features), target)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                ema_model.update_parameters(accelerator.unwrap_model(model))
                updates += 1
                if updates >= args.steps:
                    break
        live, averaged = evaluate(model, eval_loader, accelerator), evaluate(ema_model, eval_loader, accelerator)
        accelerator.print(f"updates {updates}: eval mse live {live:.4f} averaged {averaged:.4f}")


if __name__ == "__main__":
    main()
