"""Recurrent imputation of multivariate sensor series, trained with the PyPOTS ORT + MIT objective.

Modelled on: WenjieDu/PyPOTS#667 "Issue with saving the best model state" -- ``BaseNNModel``
kept ``self.best_model_dict = self.model.state_dict()``; ``state_dict()`` returns references to
the live parameter tensors, so the "best" state keeps following the current weights and restoring
it is a no-op.  Fixed (PR #668) with ``deepcopy(self.model.state_dict())``.

What is unusual about the loop: a "newbob"-style schedule -- after every epoch the model is
validated; an epoch that does not improve the validation MAE is rejected: the best weights are
reloaded and the learning rate is halved before training continues.  With the aliased best
state the rejection silently keeps the rejected weights.  The first optimizer step after the
first rejection is the first wrong one.  ``--healthy`` deep-copies the best state (the fix).
"""
import argparse
import copy
import math

import torch
import torch.nn as nn

torch.set_num_threads(1)

N_STEPS, N_FEATURES = 24, 6


def make_series(n, gen):
    t = torch.arange(N_STEPS).float()
    freq = 0.2 + 0.6 * torch.rand(n, 1, N_FEATURES, generator=gen)
    phase = 2 * math.pi * torch.rand(n, 1, N_FEATURES, generator=gen)
    base = torch.sin(freq * t[None, :, None] + phase)
    mix = torch.randn(N_FEATURES, N_FEATURES, generator=gen) * 0.3 + torch.eye(N_FEATURES)
    x = base @ mix + 0.1 * torch.randn(n, N_STEPS, N_FEATURES, generator=gen)
    missing = torch.rand(x.shape, generator=gen) < 0.2  # naturally missing values
    return x, (~missing).float()


def mcar(mask, rate, gen):
    """Artificially hide a fraction of the observed values (masked imputation task)."""
    hide = (torch.rand(mask.shape, generator=gen) < rate).float() * mask
    return mask - hide, hide


class BiRNNImputer(nn.Module):
    """Bidirectional recurrent imputer (BRITS-like, without the decay terms)."""

    def __init__(self, hidden=48):
        super().__init__()
        self.rnn = nn.GRU(2 * N_FEATURES, hidden, batch_first=True, bidirectional=True)
        self.reduce = nn.Linear(2 * hidden, N_FEATURES)

    def forward(self, x, mask):
        h, _ = self.rnn(torch.cat([x * mask, mask], -1))
        recon = self.reduce(h)
        imputed = mask * x + (1 - mask) * recon
        return recon, imputed


def masked_mae(pred, target, mask):
    return (torch.abs(pred - target) * mask).sum() / (mask.sum() + 1e-9)


def validate(model, val):
    x, obs_mask, hidden = val
    model.eval()
    with torch.no_grad():
        _, imputed = model(x, obs_mask)
    model.train()
    return masked_mae(imputed, x, hidden).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x_train, m_train = make_series(192, gen)
    x_val, m_val = make_series(64, gen)
    val_mask, val_hidden = mcar(m_val, 0.2, gen)
    val = (x_val, val_mask, val_hidden)

    model = BiRNNImputer()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    best_loss = float("inf")
    best_model_dict = None
    step, onset, rejection = 0, None, None
    for epoch in range(args.epochs):
        perm = torch.randperm(x_train.shape[0], generator=gen)
        for i in range(0, x_train.shape[0], args.batch_size):
            idx = perm[i:i + args.batch_size]
            x, m = x_train[idx], m_train[idx]
            input_mask, hidden = mcar(m, 0.2, gen)
            recon, _ = model(x, input_mask)
            ort = masked_mae(recon, x, input_mask)   # observed reconstruction task
            mit = masked_mae(recon, x, hidden)       # masked imputation task
            loss = ort + mit
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1

        val_mae = validate(model, val)
        lr = optimizer.param_groups[0]["lr"]
        if val_mae < best_loss:
            best_loss = val_mae
            best_model_dict = copy.deepcopy(model.state_dict()) if args.healthy else model.state_dict()
            verdict = "accepted"
        else:
            model.load_state_dict(best_model_dict)
            for g in optimizer.param_groups:
                g["lr"] = lr * 0.5
            verdict = "rejected -> reload best, halve lr"
            if rejection is None:
                rejection = (epoch, val_mae, validate(model, val), best_loss)
                onset = step
                if not args.healthy:
                    print(f"ONSET step {onset}")
        print(f"epoch {epoch} step {step} train_loss {loss.item():.4f} val_mae {val_mae:.4f} "
              f"lr {lr:.1e} {verdict}")

    e, rejected_mae, restored_mae, recorded_best = rejection
    print(f"EVIDENCE first rejection (epoch {e}): rejected val_mae {rejected_mae:.5f}, "
          f"val_mae after restoring best {restored_mae:.5f}, recorded best {recorded_best:.5f}")


if __name__ == "__main__":
    main()
