"""Sensor-placement style interpolation of a temperature field with a SetConv Gaussian process-like model.

Each task holds a handful of "weather stations" (context points: location + reading) and a set
of target locations; a SetConv encoder (RBF smoothing of the context readings at several learnable
length scales, plus a density channel) feeds an MLP decoder that predicts a Gaussian mean/std at
every target.  Training minimises the Gaussian NLL over batches of tasks.

Modelled on: alan-turing-institute/deepsensor#47 "Maintain optimiser object during training":
``deepsensor.train.train_epoch(model, tasks, lr, batch_size, opt=None)`` instantiated a fresh Adam
whenever ``opt`` was not given, and the documented loop called it once per epoch, so the Adam
moments and the bias-correction step counter were thrown away at every epoch boundary ("loses
the momentum information gathered from previous training epochs").  The fix was a ``Trainer``
object that owns the optimiser across epochs.

Unusual about the loop: tasks are generated once and reshuffled per epoch with their own
generator; the per-epoch function owns the optimiser in the buggy variant.  With ``--healthy``
the ``Trainer`` keeps one Adam for the whole run.  The first epoch (steps 0-7) is identical in both.
"""
import argparse
import math
import time

import torch
import torch.nn as nn

torch.set_num_threads(1)

N_TASKS, BATCH_TASKS, N_EPOCHS = 128, 16, 5
N_CTX, N_TGT = 24, 48


def make_field(g):
    """Smooth random field on [0,1]^2: linear trend + a few Gaussian bumps."""
    centers = torch.rand(4, 2, generator=g)
    amps = torch.randn(4, generator=g) * 1.5
    widths = 0.08 + 0.15 * torch.rand(4, generator=g)
    trend = torch.randn(2, generator=g)

    def f(xy):
        d2 = ((xy[:, None, :] - centers[None]) ** 2).sum(-1)
        return (amps * torch.exp(-d2 / (2 * widths ** 2))).sum(-1) + xy @ trend
    return f


def make_tasks(n, seed):
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for _ in range(n):
        f = make_field(g)
        xc, xt = torch.rand(N_CTX, 2, generator=g), torch.rand(N_TGT, 2, generator=g)
        yc = f(xc) + 0.05 * torch.randn(N_CTX, generator=g)
        yt = f(xt) + 0.05 * torch.randn(N_TGT, generator=g)
        tasks.append({"X_c": xc, "Y_c": yc, "X_t": xt, "Y_t": yt})
    return tasks


def collate(tasks):
    return {k: torch.stack([t[k] for t in tasks]) for k in tasks[0]}


class SetConvGNP(nn.Module):
    def __init__(self, n_scales=6, hidden=64):
        super().__init__()
        self.log_ls = nn.Parameter(torch.linspace(math.log(0.03), math.log(0.4), n_scales))
        self.decoder = nn.Sequential(
            nn.Linear(2 * n_scales + 2, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 2),
        )

    def forward(self, X_c, Y_c, X_t):
        d2 = ((X_t[:, :, None, :] - X_c[:, None, :, :]) ** 2).sum(-1)          # B,T,C
        ls = self.log_ls.exp()
        w = torch.exp(-d2[..., None] / (2 * ls ** 2))                           # B,T,C,S
        density = w.sum(2)                                                      # B,T,S
        signal = (w * Y_c[:, None, :, None]).sum(2) / (density + 1e-4)
        h = torch.cat([signal, torch.log1p(density), X_t], -1)
        out = self.decoder(h)
        return out[..., 0], nn.functional.softplus(out[..., 1]) + 1e-3


def nll(model, batch):
    mean, std = model(batch["X_c"], batch["Y_c"], batch["X_t"])
    return -torch.distributions.Normal(mean, std).log_prob(batch["Y_t"]).mean()


def train_epoch(model, tasks, lr=1e-3, batch_size=BATCH_TASKS, opt=None, shuffle_gen=None, log=None):
    """One pass over the tasks (deepsensor-style signature: ``opt=None`` builds a new Adam)."""
    if opt is None:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.randperm(len(tasks), generator=shuffle_gen).tolist()
    losses = []
    for i in range(0, len(tasks), batch_size):
        batch = collate([tasks[j] for j in order[i:i + batch_size]])
        opt.zero_grad()
        loss = nll(model, batch)
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        upd = math.sqrt(sum(((p.detach() - b) ** 2).sum().item() for p, b in zip(model.parameters(), before)))
        if log is not None:
            log.append(upd)
        losses.append(loss.item())
    return losses, opt


class Trainer:
    """Keeps the optimiser (and therefore Adam's moments / step count) across epochs."""

    def __init__(self, model, lr=1e-3):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)

    def __call__(self, tasks, batch_size=BATCH_TASKS, shuffle_gen=None, log=None):
        losses, _ = train_epoch(self.model, tasks, batch_size=batch_size, opt=self.opt,
                                shuffle_gen=shuffle_gen, log=log)
        return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    train_tasks, val_tasks = make_tasks(N_TASKS, 1), make_tasks(32, 2)
    model = SetConvGNP()
    shuffle_gen = torch.Generator().manual_seed(3)
    steps_per_epoch = N_TASKS // BATCH_TASKS
    update_norms = []
    trainer = Trainer(model, lr=args.lr) if args.healthy else None
    opt = None
    for epoch in range(N_EPOCHS):
        if args.healthy:
            losses = trainer(train_tasks, shuffle_gen=shuffle_gen, log=update_norms)
            opt = trainer.opt
        else:
            if epoch == 1:
                print(f"ONSET step {epoch * steps_per_epoch}", flush=True)
            losses, opt = train_epoch(model, train_tasks, lr=args.lr, shuffle_gen=shuffle_gen,
                                      log=update_norms)
        with torch.no_grad():
            val = nll(model, collate(val_tasks)).item()
        print(f"epoch {epoch} train_nll {sum(losses) / len(losses):.4f} val_nll {val:.4f}", flush=True)

    adam_steps = int(opt.state[model.log_ls]["step"].item())
    jump = [update_norms[k * steps_per_epoch] / update_norms[k * steps_per_epoch - 1]
            for k in range(1, N_EPOCHS)]
    print(f"EVIDENCE adam_step_counter={adam_steps} (optimizer steps taken={len(update_norms)}); "
          f"update-norm ratio first-step-of-epoch/previous-step={sum(jump) / len(jump):.2f}; "
          f"final val_nll={val:.4f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
