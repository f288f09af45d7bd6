"""Temporal Convolutional Network for polyphonic music (next-frame prediction), in Lightning.

Modelled on: locuslab/TCN (Bai, Kolter & Koltun, "An Empirical Evaluation of Generic
Convolutional and Recurrent Networks for Sequence Modeling", 2018): ``TCN/tcn.py``
(``TemporalBlock`` = two weight-normalised dilated causal ``Conv1d`` + ``Chomp1d`` +
ReLU + dropout with a 1x1 downsample residual, conv weights drawn from N(0, 0.01)) and
``TCN/poly_music`` (``model.py``: TCN over the 88-key piano roll, a linear layer per
time step and a sigmoid; ``music_test.py``: ``x = roll[:-1]``, ``y = roll[1:]``,
negative log-likelihood of the next frame, Adam, gradient clipping).  The JSB/Nottingham
piano rolls are replaced by synthetic chord progressions on 48 keys, and sequences are
batched (the reference feeds one sequence at a time).  Written as a LightningModule,
with Lightning's ``GradientAccumulationScheduler`` callback.

What is unusual about the loop:
  * ``torch.nn.utils.parametrizations.weight_norm``: the conv ``weight`` is not a
    parameter; it is recomputed from ``original0`` (g, the per-channel norm) and
    ``original1`` (v, the direction) on every forward.  The N(0, 0.01) init is applied
    to the plain weight *before* the parametrization is registered, so g and v are
    derived from it (setting ``.weight.data`` after ``weight_norm`` would be lost).
  * The gradient-accumulation factor changes during training (1 batch per optimizer step
    in epochs 0-2, 2 in epoch 3, 4 in epoch 4), so the number of optimizer steps per
    epoch drops and the effective batch size grows mid-run.
  * Gradient clipping by norm through the Trainer (``gradient_clip_val``).
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def make_piano_rolls(n_seqs, seq_len, g, n_keys=48):
    """Chord progressions: each chord (3 notes) is held 2-4 frames; the next chord is the
    successor of the current one on a fixed 8-chord cycle with probability 0.8."""
    roots = torch.tensor([0, 5, 7, 3, 8, 10, 2, 12]) + 12
    chords = torch.stack([roots, roots + 4, roots + 7], dim=1)
    rolls = torch.zeros(n_seqs, seq_len, n_keys)
    for i in range(n_seqs):
        c, t = int(torch.randint(0, 8, (1,), generator=g)), 0
        while t < seq_len:
            hold = int(torch.randint(2, 5, (1,), generator=g))
            rolls[i, t:t + hold, chords[c]] = 1.0
            if torch.rand(1, generator=g).item() < 0.3:      # occasional melody note on top
                rolls[i, t:t + hold, int(chords[c, 2]) + 5] = 1.0
            t += hold
            c = (c + 1) % 8 if torch.rand(1, generator=g).item() < 0.8 else int(torch.randint(0, 8, (1,), generator=g))
    return rolls


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


def wn_conv(n_in, n_out, kernel_size, dilation, padding):
    conv = nn.Conv1d(n_in, n_out, kernel_size, padding=padding, dilation=dilation)
    conv.weight.data.normal_(0, 0.01)  # before weight_norm, so g and v are computed from it
    return weight_norm(conv)


class TemporalBlock(nn.Module):
    def __init__(self, n_inputs, n_outputs, kernel_size, dilation, padding, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(
            wn_conv(n_inputs, n_outputs, kernel_size, dilation, padding), Chomp1d(padding),
            nn.ReLU(), nn.Dropout(dropout),
            wn_conv(n_outputs, n_outputs, kernel_size, dilation, padding), Chomp1d(padding),
            nn.ReLU(), nn.Dropout(dropout),
        )
        self.downsample = nn.Conv1d(n_inputs, n_outputs, 1) if n_inputs != n_outputs else None
        if self.downsample is not None:
            self.downsample.weight.data.normal_(0, 0.01)
        self.relu = nn.ReLU()

    def forward(self, x):
        res = x if self.downsample is None else self.downsample(x)
        return self.relu(self.net(x) + res)


class TCN(L.LightningModule):
    def __init__(self, input_size=48, output_size=48, num_channels=(32, 32, 32),
                 kernel_size=5, dropout=0.1, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        layers = []
        for i, out_ch in enumerate(num_channels):
            in_ch = input_size if i == 0 else num_channels[i - 1]
            dilation = 2 ** i
            layers.append(TemporalBlock(in_ch, out_ch, kernel_size, dilation,
                                        padding=(kernel_size - 1) * dilation, dropout=dropout))
        self.tcn = nn.Sequential(*layers)
        self.linear = nn.Linear(num_channels[-1], output_size)
        self.linear.weight.data.normal_(0, 0.01)

    def forward(self, x):                       # x: (batch, time, keys)
        return self.linear(self.tcn(x.transpose(1, 2)).transpose(1, 2))   # logits

    def _nll(self, batch):
        roll = batch[0]
        x, y = roll[:, :-1], roll[:, 1:]
        # NLL of the next frame summed over keys, averaged over frames (as in music_test.py)
        return F.binary_cross_entropy_with_logits(self(x), y, reduction="sum") / (y.shape[0] * y.shape[1])

    def training_step(self, batch, batch_idx):
        loss = self._nll(batch)
        self.log("train_nll", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_nll", self._nll(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class StepReport(Callback):
    def __init__(self):
        self.steps_at_epoch_end = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.steps_at_epoch_end.append(trainer.global_step)
        m = trainer.callback_metrics
        print(f"epoch {trainer.current_epoch}: global_step {trainer.global_step} "
              f"accumulate {trainer.accumulate_grad_batches} "
              f"train_nll {m.get('train_nll', float('nan')):.4f} val_nll {m.get('val_nll', float('nan')):.4f}")


def main():
    L.seed_everything(1111, workers=True)
    g = torch.Generator().manual_seed(1111)
    train_rolls, val_rolls = make_piano_rolls(512, 48, g), make_piano_rolls(128, 48, g)
    train_loader = DataLoader(TensorDataset(train_rolls), batch_size=32, shuffle=True)
    val_loader = DataLoader(TensorDataset(val_rolls), batch_size=128)

    model = TCN()
    n_param_tensors = len(list(model.parameters()))
    n_wn = sum(1 for n, _ in model.named_parameters() if "parametrizations.weight.original" in n)
    p = train_rolls.mean(dim=(0, 1)).clamp(1e-4, 1 - 1e-4)
    y = val_rolls[:, 1:]
    unigram = -(y * p.log() + (1 - y) * (1 - p).log()).sum(-1).mean()
    print(f"{n_param_tensors} parameter tensors, {n_wn} of them are weight-norm g/v; "
          f"per-key frequency baseline val_nll {unigram:.4f}")

    report = StepReport()
    trainer = L.Trainer(
        max_epochs=5, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
        callbacks=[GradientAccumulationScheduler(scheduling={0: 1, 3: 2, 4: 4}), report],
        num_sanity_val_steps=0,
    )
    trainer.fit(model, train_loader, val_loader)
    print(f"optimizer steps per epoch: "
          f"{[b - a for a, b in zip([0] + report.steps_at_epoch_end[:-1], report.steps_at_epoch_end)]}")


if __name__ == "__main__":
    main()
