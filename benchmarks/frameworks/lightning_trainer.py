"""Training a tiny GPT-2 (built from a config) as a causal LM with PyTorch Lightning's
``Trainer``, written as its docs show: a ``LightningModule`` with ``training_step``,
``validation_step`` and ``configure_optimizers``, periodic validation, default sanity
check. Runs on one CPU device, or on two with ``--devices 2`` (strategy ``ddp``: Lightning
launches the second process itself; gloo on CPU).

Planted bugs (``--bug``), each live from iteration ``--onset``:

- ``stale_optimizer``: a "resume best weights" callback rebuilds the network from its
  config at the onset and loads the saved state into the new modules; the optimizer
  Lightning built from ``configure_optimizers`` still holds the old parameters, so from
  then on every optimizer step updates nothing the model uses.
- ``rank_drift`` (``--devices 2``): a weight-noise regulariser applied at the onset draws
  its noise from a per-rank seed (``seed + global_rank``), so the replicas differ from
  then on (DDP synchronises gradients, never parameters).
"""

from __future__ import annotations

import tempfile

from _common import NextToken, parse_args, tiny_gpt2_config

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

BUGS = ("stale_optimizer", "rank_drift")


class TinyCausalLM(L.LightningModule):
    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = GPT2LMHeadModel(tiny_gpt2_config())

    def training_step(self, batch, batch_idx):
        loss = self.net(**batch).loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.net(**batch).loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class ResumeBestWeights(L.Callback):
    """Reloads a saved state into a freshly built network (the bug: a new module tree)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at_step:
            state = pl_module.net.state_dict()
            pl_module.net = GPT2LMHeadModel(tiny_gpt2_config())
            pl_module.net.load_state_dict(state)


class RankSeededWeightNoise(L.Callback):
    """Weight noise whose generator is seeded per rank (the bug: replicas get different noise)."""

    def __init__(self, at_step: int, seed: int) -> None:
        self.at_step, self.seed = at_step, seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at_step:
            generator = torch.Generator().manual_seed(self.seed + trainer.global_rank)
            with torch.no_grad():
                for p in pl_module.net.transformer.h[0].parameters():
                    p.add_(torch.randn(p.shape, generator=generator) * 1e-2)


def main() -> None:
    args = parse_args(__doc__, BUGS)
    L.seed_everything(args.seed, verbose=False)
    model = TinyCausalLM()
    callbacks: list[L.Callback] = []
    if args.bug == "stale_optimizer":
        callbacks.append(ResumeBestWeights(args.onset))
    if args.bug == "rank_drift":
        callbacks.append(RankSeededWeightNoise(args.onset, args.seed))
    train = DataLoader(NextToken(256, args.seed), batch_size=8, shuffle=True,
                       generator=torch.Generator().manual_seed(args.seed))
    val = DataLoader(NextToken(32, args.seed + 1), batch_size=16)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = L.Trainer(
            accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
            max_steps=args.steps, val_check_interval=args.onset, limit_val_batches=2,
            accumulate_grad_batches=args.grad_accum, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.output_dir or scratch,
            callbacks=callbacks,
        )
        trainer.fit(model, train, val)
    if trainer.global_rank == 0:
        print(f"done: {trainer.global_step} steps, metrics {dict(trainer.callback_metrics)}", flush=True)


if __name__ == "__main__":
    main()
