"""Truncated backpropagation through time with Lightning manual optimization (LSTM).

Modelled on: the Lightning 2.x documentation page "Truncated Backpropagation Through Time
(TBPTT)" (lightning.ai/docs/pytorch/stable/common/tbptt.html): since Lightning 2.0 the
``truncated_bptt_steps`` attribute is gone and the recipe is ``automatic_optimization =
False``, split every batch along the time dimension, run the chunks in a loop carrying
the hidden state, ``manual_backward`` + ``optimizer.step()`` + ``zero_grad()`` per chunk,
and ``detach()`` the hidden state between chunks; the docs' example task is the
``AverageDataset`` (input ``randn(len, seq, 10)``, target ``top + bottom.roll(1, -1)``).
Here the target additionally depends on the input 3 steps earlier, so the carried hidden
state matters at chunk boundaries.

What is unusual about the loop:
  * Several optimizer steps per batch (one per 25-step chunk, 4 per batch), so
    ``global_step`` advances by 4 per ``training_step`` call.
  * The hidden state is carried across chunks but detached, so each backward only
    reaches 25 steps back; the first chunk of every batch starts from a zero state.
  * Gradient clipping is called by hand (``self.clip_gradients``) because Lightning does
    not clip in manual optimization; the LR scheduler is stepped by hand at epoch end.
  * Validation runs the full 100-step sequence in one go with no truncation, from a
    fixed-seed dataset, so its loss is on a different footing than the chunk losses.
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


class AverageDataset(Dataset):
    def __init__(self, dataset_len=300, sequence_len=100, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.input_seq = torch.randn(dataset_len, sequence_len, 10, generator=g)
        top, bottom = self.input_seq.chunk(2, -1)
        delayed = torch.zeros_like(top)
        delayed[:, 3:] = top[:, :-3]                     # memory: input from 3 steps ago
        self.output_seq = top + bottom.roll(shifts=1, dims=-1) + 0.5 * delayed

    def __len__(self):
        return len(self.input_seq)

    def __getitem__(self, item):
        return self.input_seq[item], self.output_seq[item]


class LitModel(L.LightningModule):
    def __init__(self, hidden_dim=48, truncated_bptt_steps=25, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        # 1. Switch to manual optimization
        self.automatic_optimization = False
        self.truncated_bptt_steps = truncated_bptt_steps
        self.rnn = nn.LSTM(10, hidden_dim, batch_first=True)
        self.linear_out = nn.Linear(hidden_dim, 5)

    def forward(self, x, hiddens=None):
        out, hiddens = self.rnn(x, hiddens)
        return self.linear_out(out), hiddens

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        hiddens = None
        chunk_losses = []
        # 2. Split the batch in chunks along the time dimension
        for x_chunk, y_chunk in zip(x.split(self.truncated_bptt_steps, dim=1),
                                    y.split(self.truncated_bptt_steps, dim=1)):
            # 3. Perform the optimization in a loop
            pred, hiddens = self(x_chunk, hiddens)
            loss = F.mse_loss(pred, y_chunk)
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt.step()
            # 4. "Truncate": keep the values, cut the graph
            hiddens = tuple(h.detach() for h in hiddens)
            chunk_losses.append(loss.detach())
        self.log("train_loss", torch.stack(chunk_losses).mean(), prog_bar=False)
        self.log("first_chunk_loss", chunk_losses[0])
        self.log("last_chunk_loss", chunk_losses[-1])

    def on_train_epoch_end(self):
        sch = self.lr_schedulers()
        sch.step()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred, _ = self(x)
        self.log("val_loss", F.mse_loss(pred, y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.6)
        return [optimizer], [scheduler]


class Report(L.Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        print(f"epoch {trainer.current_epoch} global_step {trainer.global_step} "
              f"lr {trainer.optimizers[0].param_groups[0]['lr']:.2e} "
              f"train {m['train_loss']:.4f} (first chunk {m['first_chunk_loss']:.4f}, "
              f"last chunk {m['last_chunk_loss']:.4f}) val {m['val_loss']:.4f}")


def main():
    L.seed_everything(7)
    train_loader = DataLoader(AverageDataset(256, 100, seed=0), batch_size=64, shuffle=True)
    val_loader = DataLoader(AverageDataset(128, 100, seed=1), batch_size=128)
    model = LitModel()
    trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Report()], num_sanity_val_steps=0)
    trainer.fit(model, train_loader, val_loader)
    print(f"total optimizer steps: {trainer.global_step}")


if __name__ == "__main__":
    main()
