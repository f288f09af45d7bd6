"""Lightning's ``StochasticWeightAveraging`` recomputes BatchNorm statistics in one more
pass through the training loop with backward switched off; the trainer still calls
``clip_grad_norm_`` and ``optimizer.step`` at its end, on parameters without gradients.
Those two calls are not recorded, the verdict's coverage says so, and the run is clean
with the shipped set; the same loop's ordinary steps are all recorded."""

from __future__ import annotations

import subprocess
import sys

import lightning.pytorch as lightning
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import producers
from invariants.events import CLIP_GRAD_NORM, OPTIMIZER_STEP
from producers.trainer_passes import trainer_skips_backward
from tests.support.producer_traces import trace_batches, trace_events


EPOCHS, BATCHES = 3, 4


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _fit(tmp_path, callbacks) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * BATCHES, 8), torch.randn(8 * BATCHES, 1))
    with producers.instrument(run_id="r-swa", trace_dir=tmp_path, quiet=True):
        trainer = lightning.Trainer(max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                    devices=1, precision="bf16-mixed", gradient_clip_val=1.0, callbacks=callbacks)
        trainer.fit(Regressor(), DataLoader(data, batch_size=8))


def _recorded(tmp_path, api: str) -> int:
    return sum(1 for _, event in trace_events(trace_batches(tmp_path))
               if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == api)


def test_lightning_keeps_the_flag_the_producer_reads():
    """The private attribute relied on: the automatic-optimization loop's ``_skip_backward``."""
    trainer = lightning.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    loop = trainer.fit_loop.epoch_loop.automatic_optimization
    assert type(loop).__name__ == "_AutomaticOptimization" and loop._skip_backward is False
    trainer.fit_loop._skip_backward = True
    assert loop._skip_backward is True


def test_outside_a_trainer_nothing_is_left_out():
    assert trainer_skips_backward() is False


def test_the_statistics_pass_of_swa_is_left_out_and_said(tmp_path):
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    _fit(tmp_path, [StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1)])
    assert _recorded(tmp_path, OPTIMIZER_STEP) == EPOCHS * BATCHES  # the pass's own step is not among them
    assert _recorded(tmp_path, CLIP_GRAD_NORM) == EPOCHS * BATCHES
    result = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 optimizer or clipping calls a trainer made without a backward not recorded" in result.stdout


def test_without_the_callback_every_call_is_recorded(tmp_path):
    _fit(tmp_path, [])
    assert _recorded(tmp_path, OPTIMIZER_STEP) == EPOCHS * BATCHES
    assert _recorded(tmp_path, CLIP_GRAD_NORM) == EPOCHS * BATCHES
