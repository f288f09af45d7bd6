"""LSTM sentence VAE with a cyclical KL-annealing schedule, in Lightning.

Modelled on: haofuml/cyclical_annealing (Fu et al., "Cyclical Annealing Schedule: A
Simple Approach to Mitigating KL Vanishing", NAACL 2019), ``language_model/
train_text_cyc_ptb.py`` (built on harvardnlp/sa-vae: LSTM encoder -> (mu, logvar), LSTM
decoder that gets z at every step, loss = NLL + beta * KL) and its ``frange_cycle_linear(
n_iter, start, stop, n_cycle, ratio)`` schedule: beta rises linearly from 0 to 1 during
the first ``ratio`` of each of ``n_cycle`` cycles and is held at 1 for the rest.  The
Penn Treebank is replaced by synthetic sentences drawn from 8 noisy templates.

What is unusual about the loop:
  * The training objective changes every step: beta is read from a precomputed
    schedule at ``self.global_step`` and drops from 1 back to 0 at the start of every
    cycle, so the logged training loss jumps *down* at each restart and climbs as beta
    grows, with no change to the model.
  * The reported validation ELBO always uses beta = 1 and a ``torch.Generator`` seeded
    afresh at every validation, so validations use identical reparameterisation noise
    and are comparable across the run.
  * Validation runs every 8 training batches, in the middle of an epoch.
  * Active units (Burda et al.) are counted at each validation: latent dimensions whose
    posterior mean varies across inputs.
"""
import math

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)

VOCAB, SEQ_LEN, BOS, PAD = 32, 16, 1, 0


def frange_cycle_linear(n_iter, start=0.0, stop=1.0, n_cycle=4, ratio=0.5):
    schedule = np.ones(n_iter) * stop
    period = n_iter / n_cycle
    step = (stop - start) / (period * ratio)
    for c in range(n_cycle):
        v, i = start, 0
        while v <= stop and int(i + c * period) < n_iter:
            schedule[int(i + c * period)] = v
            v += step
            i += 1
    return schedule


def make_sentences(n, seed, n_templates=8, noise=0.1):
    templates = torch.randint(2, VOCAB, (n_templates, SEQ_LEN), generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(seed)
    which = torch.randint(0, n_templates, (n,), generator=g)
    sents = templates[which].clone()
    corrupt = torch.rand(n, SEQ_LEN, generator=g) < noise
    sents[corrupt] = torch.randint(2, VOCAB, (int(corrupt.sum()),), generator=g)
    return sents


class SentenceVAE(L.LightningModule):
    def __init__(self, total_steps, emb=32, hidden=64, latent=8, lr=3e-3, n_cycle=3, ratio=0.5):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, emb)
        self.encoder = nn.LSTM(emb, hidden, batch_first=True)
        self.to_stats = nn.Linear(hidden, 2 * latent)
        self.latent_to_h = nn.Linear(latent, hidden)
        self.decoder = nn.LSTM(emb + latent, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)
        self.register_buffer("beta_schedule", torch.tensor(
            frange_cycle_linear(total_steps, 0.0, 1.0, n_cycle, ratio), dtype=torch.float32))

    def encode(self, x):
        _, (h, _) = self.encoder(self.embed(x))
        mu, logvar = self.to_stats(h[-1]).chunk(2, dim=-1)
        return mu, logvar

    def decode(self, x, z):
        dec_in = torch.cat([torch.full_like(x[:, :1], BOS), x[:, :-1]], dim=1)
        emb = self.embed(dec_in)
        emb = torch.cat([emb, z.unsqueeze(1).expand(-1, emb.size(1), -1)], dim=-1)
        h0 = torch.tanh(self.latent_to_h(z)).unsqueeze(0)
        out, _ = self.decoder(emb, (h0, torch.zeros_like(h0)))
        return self.out(out)

    def elbo_terms(self, x, generator=None):
        mu, logvar = self.encode(x)
        eps = torch.randn(mu.shape, generator=generator, device=mu.device)
        z = mu + torch.exp(0.5 * logvar) * eps
        logits = self.decode(x, z)
        nll = F.cross_entropy(logits.reshape(-1, VOCAB), x.reshape(-1), reduction="sum") / x.size(0)
        kl = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1)).mean()
        return nll, kl, mu

    def training_step(self, batch, batch_idx):
        (x,) = batch
        step = min(self.global_step, len(self.beta_schedule) - 1)
        beta = self.beta_schedule[step]
        nll, kl, _ = self.elbo_terms(x)
        loss = nll + beta * kl
        self.log_dict({"train_loss": loss, "beta": beta, "train_kl": kl})
        return loss

    def on_validation_epoch_start(self):
        self.val_gen = torch.Generator().manual_seed(2024)   # same noise at every validation
        self.val_mus = []

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        nll, kl, mu = self.elbo_terms(x, generator=self.val_gen)
        self.val_mus.append(mu)
        self.log_dict({"val_nll": nll, "val_kl": kl, "val_neg_elbo": nll + kl})

    def on_validation_epoch_end(self):
        mus = torch.cat(self.val_mus)
        self.log("active_units", (mus.var(dim=0) > 0.01).sum().float())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class Report(L.Callback):
    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        print(f"epoch {trainer.current_epoch} step {trainer.global_step:3d} beta {m['beta']:.3f} "
              f"train_loss {m['train_loss']:.3f} | val -ELBO {m['val_neg_elbo']:.3f} "
              f"(nll {m['val_nll']:.3f}, kl {m['val_kl']:.3f}) active_units {int(m['active_units'])}")


def main():
    L.seed_everything(3)
    train = TensorDataset(make_sentences(768, seed=1))
    val = TensorDataset(make_sentences(256, seed=2))
    train_loader = DataLoader(train, batch_size=32, shuffle=True)
    val_loader = DataLoader(val, batch_size=128)
    max_epochs = 3
    total_steps = max_epochs * len(train_loader)
    model = SentenceVAE(total_steps=total_steps)
    print(f"{total_steps} steps; beta schedule (every 4th step): "
          f"{[round(b, 2) for b in model.beta_schedule[::4].tolist()]}")
    print(f"uniform-decoder NLL per sentence: {SEQ_LEN * math.log(VOCAB):.2f}")
    trainer = L.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, val_check_interval=8,
                        num_sanity_val_steps=0, callbacks=[Report()])
    trainer.fit(model, train_loader, val_loader)


if __name__ == "__main__":
    main()
