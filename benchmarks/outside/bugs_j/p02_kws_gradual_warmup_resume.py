"""Keyword spotting (MFCC-like frames -> 12 commands) with a 1D TC-ResNet-style
model, gradual LR warm-up followed by cosine annealing, and a mid-run
checkpoint/resume (preemptible job).

Modelled on: ildoonet/pytorch-gradual-warmup-lr#27 "Target optimizer not set
properly when loading from state dict".  ``GradualWarmupScheduler`` keeps the
cosine ``after_scheduler`` as an attribute, so ``state_dict()`` pickles the
whole nested scheduler object *including its reference to the optimizer*.  On
resume, ``load_state_dict`` replaces ``after_scheduler`` by the unpickled copy,
whose ``.optimizer`` is a detached copy of the old optimizer: the cosine
schedule keeps advancing (and ``get_last_lr()`` looks right) but the live
optimizer's learning rate is frozen at the value it had at the checkpoint.
The fix proposed in the issue is to re-attach it in ``load_state_dict``:
``self.after_scheduler.optimizer = self.optimizer``.

Unusual about the loop: the scheduler is stepped per optimizer step; the run is
"preempted" after 16 steps, everything is saved with torch.save to a temp dir
and a fresh process state (new model/optimizer/scheduler) is rebuilt and
restored from it; label smoothing; AdamW.
Run: python p02_kws_gradual_warmup_resume.py [--healthy]
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler

torch.set_num_threads(1)
HEALTHY = False


class GradualWarmupScheduler(LRScheduler):
    """Gradually warm-up (increasing) learning rate, then hand over to after_scheduler."""

    def __init__(self, optimizer, multiplier, total_epoch, after_scheduler=None):
        self.multiplier = multiplier
        if self.multiplier < 1.0:
            raise ValueError("multiplier should be greater than or equal to 1.")
        self.total_epoch = total_epoch
        self.after_scheduler = after_scheduler
        self.finished = False
        super().__init__(optimizer)

    def get_lr(self):
        if self.last_epoch > self.total_epoch:
            if self.after_scheduler:
                if not self.finished:
                    self.after_scheduler.base_lrs = [b * self.multiplier for b in self.base_lrs]
                    self.finished = True
                return self.after_scheduler.get_last_lr()
            return [b * self.multiplier for b in self.base_lrs]
        if self.multiplier == 1.0:
            return [b * (float(self.last_epoch) / self.total_epoch) for b in self.base_lrs]
        return [b * ((self.multiplier - 1.0) * self.last_epoch / self.total_epoch + 1.0)
                for b in self.base_lrs]

    def step(self, epoch=None):
        if self.finished and self.after_scheduler:
            self.after_scheduler.step()
            self._last_lr = self.after_scheduler.get_last_lr()
        else:
            return super().step(epoch)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if HEALTHY and self.after_scheduler is not None:
            self.after_scheduler.optimizer = self.optimizer


class TCBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv1d(c_in, c_out, 9, stride, padding=4, bias=False)
        self.bn1 = nn.BatchNorm1d(c_out)
        self.conv2 = nn.Conv1d(c_out, c_out, 9, 1, padding=4, bias=False)
        self.bn2 = nn.BatchNorm1d(c_out)
        self.skip = nn.Sequential(nn.Conv1d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm1d(c_out))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.skip(x))


class TCResNet(nn.Module):
    def __init__(self, n_mfcc=40, n_classes=12):
        super().__init__()
        self.stem = nn.Conv1d(n_mfcc, 32, 3, padding=1, bias=False)
        self.blocks = nn.Sequential(TCBlock(32, 48, 2), TCBlock(48, 64, 2))
        self.head = nn.Linear(64, n_classes)

    def forward(self, mfcc):  # (B, n_mfcc, T)
        return self.head(self.blocks(self.stem(mfcc)).mean(-1))


def synth_mfcc(n, seed, n_classes=12, n_mfcc=40, frames=48):
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(n_classes, n_mfcc, 12, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = 0.3 * torch.randn(n, n_mfcc, frames, generator=g)
    onsets = torch.randint(0, frames - 12, (n,), generator=g)
    for i in range(n):
        x[i, :, onsets[i]:onsets[i] + 12] += templates[y[i]]
    return x, y


def build(total_steps, warmup):
    model = TCResNet()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    cosine = CosineAnnealingLR(opt, T_max=total_steps - warmup, eta_min=1e-5)
    sched = GradualWarmupScheduler(opt, multiplier=1.0, total_epoch=warmup, after_scheduler=cosine)
    return model, opt, sched


def train_steps(model, opt, sched, loader_iter, start, stop, lr_log):
    for step in range(start, stop):
        x, y = next(loader_iter)
        model.train()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_log.append((step, opt.param_groups[0]["lr"], sched.get_last_lr()[0]))
        sched.step()
        if step % 8 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e}")


def main():
    global HEALTHY
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    args = parser.parse_args()
    HEALTHY = args.healthy

    torch.manual_seed(0)
    total_steps, warmup, preempt_at = 40, 5, 16
    x, y = synth_mfcc(40 * 32, seed=1)
    ds = torch.utils.data.TensorDataset(x, y)

    def batches():
        while True:
            for b in torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True):
                yield b

    it = batches()
    lr_log = []
    model, opt, sched = build(total_steps, warmup)
    # the first optimizer.step() happens with lr=0 under multiplier=1 warm-up; that is intended
    train_steps(model, opt, sched, it, 0, preempt_at, lr_log)

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "last.pt")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": preempt_at}, path)
        del model, opt, sched
        # ---- job restarted on a new node ----
        model, opt, sched = build(total_steps, warmup)
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        start = ckpt["step"]
        print(f"resumed from step {start}, lr {opt.param_groups[0]['lr']:.2e}")

    if not HEALTHY:
        # first step after the resume whose lr should have come from the cosine schedule
        print(f"ONSET step {start + 1}")
    train_steps(model, opt, sched, it, start, total_steps, lr_log)

    live = {s: lr for s, lr, _ in lr_log}
    reported = {s: r for s, _, r in lr_log}
    print(f"EVIDENCE optimizer lr at step {start + 1}={live[start + 1]:.3e} (scheduler reports "
          f"{reported[start + 1]:.3e}) | optimizer lr at last step={live[total_steps - 1]:.3e} "
          f"(scheduler reports {reported[total_steps - 1]:.3e})")


if __name__ == "__main__":
    main()
