"""1D advection-diffusion surrogate (FNO-style) trained with warmup+cosine, preempted and resumed.

Modelled on: PolymathicAI/the_well PR #63 "fixed scheduler checkpoint loading" -- the Trainer's
``save_model`` / ``load_checkpoint`` saved and restored the model and the optimizer but not the
``lr_scheduler``, so resuming a run from a checkpoint silently restarted the warmup and the cosine
decay.  The fix adds ``lr_scheduler.state_dict()`` to the checkpoint and loads it back.

What is unusual about the loop: the job is "preempted" in-process after a fixed number of steps --
the checkpoint is written to a temporary directory, every training object is rebuilt from
scratch, and training resumes from the file.  The first step after the resume still uses the
learning rate restored with the optimizer state; the scheduler's first ``step()`` after the
resume is where the buggy run falls back into warmup.  ``--healthy`` checkpoints the scheduler.
"""
import argparse
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

GRID = 64


def make_trajectories(n, steps, dt=0.05, c=1.0, nu=0.02, gen=None):
    """Exact spectral solution of u_t + c u_x = nu u_xx with periodic boundaries."""
    k = torch.fft.rfftfreq(GRID, d=1.0 / GRID) * 2 * math.pi / (2 * math.pi)  # integer wavenumbers
    x = torch.linspace(0, 2 * math.pi, GRID + 1)[:-1]
    u0 = torch.zeros(n, GRID)
    for m in range(1, 5):
        a = torch.randn(n, 1, generator=gen) / m
        ph = 2 * math.pi * torch.rand(n, 1, generator=gen)
        u0 = u0 + a * torch.sin(m * x + ph)
    u_hat0 = torch.fft.rfft(u0, dim=-1)
    traj = []
    for t in range(steps):
        decay = torch.exp((-1j * c * k - nu * k ** 2) * (t * dt))
        traj.append(torch.fft.irfft(u_hat0 * decay, n=GRID, dim=-1))
    return torch.stack(traj, 1)  # n, steps, GRID


class SpectralConv1d(nn.Module):
    def __init__(self, width, modes):
        super().__init__()
        self.modes = modes
        scale = 1.0 / (width * width)
        self.weight = nn.Parameter(scale * torch.randn(width, width, modes, 2))

    def forward(self, x):
        x_ft = torch.fft.rfft(x, dim=-1)
        w = torch.view_as_complex(self.weight)
        out = torch.zeros_like(x_ft)
        out[..., :self.modes] = torch.einsum("bim,iom->bom", x_ft[..., :self.modes], w)
        return torch.fft.irfft(out, n=x.shape[-1], dim=-1)


class FNO1d(nn.Module):
    def __init__(self, width=24, modes=12, layers=3):
        super().__init__()
        self.lift = nn.Conv1d(2, width, 1)
        self.spectral = nn.ModuleList(SpectralConv1d(width, modes) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv1d(width, width, 1) for _ in range(layers))
        self.project = nn.Sequential(nn.Conv1d(width, 64, 1), nn.GELU(), nn.Conv1d(64, 1, 1))

    def forward(self, u):
        grid = torch.linspace(0, 1, u.shape[-1]).expand(u.shape[0], 1, -1)
        h = self.lift(torch.cat([u.unsqueeze(1), grid], 1))
        for spec, pw in zip(self.spectral, self.pointwise):
            h = F.gelu(spec(h) + pw(h))
        return u + self.project(h).squeeze(1)  # predict the increment


def warmup_cosine(warmup, total, min_ratio=0.05):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        prog = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))
    return fn


class Trainer:
    def __init__(self, args, data):
        self.args, self.data = args, data
        self.model = FNO1d()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=1e-4)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(args.warmup, args.max_steps))
        self.step = 0
        self.lr_trace = {}

    def save_model(self, path):
        state = {"step": self.step, "model_state_dict": self.model.state_dict(),
                 "optimizer_state_dict": self.optimizer.state_dict()}
        if self.args.healthy:
            state["lr_scheduler_state_dict"] = self.lr_scheduler.state_dict()
        torch.save(state, path)

    def load_checkpoint(self, path):
        ckpt = torch.load(path, weights_only=True)
        self.model.load_state_dict(ckpt["model_state_dict"])
        self.optimizer.load_state_dict(ckpt["optimizer_state_dict"])
        if "lr_scheduler_state_dict" in ckpt:
            self.lr_scheduler.load_state_dict(ckpt["lr_scheduler_state_dict"])
        self.step = ckpt["step"]

    def train_until(self, stop_step):
        x_all, y_all = self.data
        gen = torch.Generator().manual_seed(1000 + self.step)
        while self.step < stop_step:
            idx = torch.randint(0, x_all.shape[0], (self.args.batch_size,), generator=gen)
            pred = self.model(x_all[idx])
            loss = F.mse_loss(pred, y_all[idx]) / y_all[idx].pow(2).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.lr_trace[self.step] = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            self.lr_scheduler.step()
            if self.step % 5 == 0:
                print(f"step {self.step:3d} nrmse_loss {loss.item():.5f} lr {self.lr_trace[self.step]:.2e}")
            self.step += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=48)
    p.add_argument("--preempt-at", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    torch.manual_seed(0)
    traj = make_trajectories(256, 6, gen=torch.Generator().manual_seed(0))
    data = (traj[:, :-1].reshape(-1, GRID), traj[:, 1:].reshape(-1, GRID))

    with tempfile.TemporaryDirectory() as ckpt_dir:
        path = os.path.join(ckpt_dir, "checkpoint.pt")
        trainer = Trainer(args, data)
        trainer.train_until(args.preempt_at)
        trainer.save_model(path)
        trace_before = dict(trainer.lr_trace)
        del trainer
        print(f"-- preempted at step {args.preempt_at}; resuming from {os.path.basename(path)} --")

        torch.manual_seed(1)  # the new process would get a fresh init before loading
        trainer = Trainer(args, data)
        trainer.load_checkpoint(path)
        trainer.lr_trace.update(trace_before)
        if not args.healthy:
            print(f"ONSET step {args.preempt_at + 1}")
        trainer.train_until(args.max_steps)

    expected = warmup_cosine(args.warmup, args.max_steps)
    k = args.preempt_at + 1
    x_all, y_all = data
    with torch.no_grad():
        final = (F.mse_loss(trainer.model(x_all), y_all) / y_all.pow(2).mean()).item()
    print(f"EVIDENCE lr at step {k} = {trainer.lr_trace[k]:.2e} (uninterrupted schedule "
          f"{args.lr * expected(k):.2e}); lr at last step = {trainer.lr_trace[args.max_steps - 1]:.2e} "
          f"(schedule {args.lr * expected(args.max_steps - 1):.2e}); final nrmse {final:.5f}")


if __name__ == "__main__":
    main()
