"""Text-to-mel conditional flow matching (F5-TTS-like, tiny) trained with
HF accelerate and gradient accumulation, with an EMA copy of the model kept by
the main process for sampling.

Modelled on: SWivid/F5-TTS#631 "EMA Update independently from
grad_accumulation_steps": in F5-TTS's ``trainer.py`` the EMA is updated
after every batch, outside ``if accelerator.sync_gradients``, whereas the
diffusers training scripts update it only when an optimizer step happened.
The maintainer: "there's no intuition here, just a bug" (fixed with #628).
With ``gradient_accumulation_steps=4`` the ema_pytorch-style EMA advances its
step counter 4x per optimizer step, so it leaves its copy-only phase
(``update_after_step``) 4x too early, averages the same weights several times
per optimizer step and uses a decay schedule meant for optimizer steps.

Unusual about the loop: ``accelerator.accumulate`` with the optimizer and a
prepared scheduler called on every micro-batch (no-ops until the sync step),
clipping only when ``sync_gradients``, EMA with warm-up decay
(``1 - (1 + t / inv_gamma) ** -power``), masked-span infilling objective.
Run: python p10_accelerate_tts_flow_ema_per_microbatch.py [--healthy]
"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator

torch.set_num_threads(1)
N_MELS, FRAMES, VOCAB = 40, 32, 30


class EMA(nn.Module):
    """ema_pytorch.EMA, reduced: copy-only until update_after_step, then warm-up decay."""

    def __init__(self, model, beta=0.999, update_after_step=24, update_every=1, inv_gamma=1.0, power=0.75):
        super().__init__()
        self.online = [model]
        self.ema_model = copy.deepcopy(model).requires_grad_(False)
        self.beta, self.update_after_step, self.update_every = beta, update_after_step, update_every
        self.inv_gamma, self.power = inv_gamma, power
        self.register_buffer("step", torch.tensor(0))
        self.first_average = False

    def current_decay(self):
        epoch = max(self.step.item() - self.update_after_step - 1, 0)
        value = 1 - (1 + epoch / self.inv_gamma) ** -self.power
        return 0.0 if epoch <= 0 else min(value, self.beta)

    @torch.no_grad()
    def update(self):
        step = self.step.item()
        self.step += 1
        if step % self.update_every != 0:
            return
        src = self.online[0]
        if step <= self.update_after_step:
            for e, p in zip(self.ema_model.parameters(), src.parameters()):
                e.copy_(p)
            return
        self.first_average = step == self.update_after_step + 1
        d = self.current_decay()
        for e, p in zip(self.ema_model.parameters(), src.parameters()):
            e.lerp_(p, 1 - d)


class TinyCFM(nn.Module):
    def __init__(self, dim=96):
        super().__init__()
        self.text_emb = nn.Embedding(VOCAB, dim)
        self.time_mlp = nn.Sequential(nn.Linear(32, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.in_proj = nn.Conv1d(2 * N_MELS, dim, 3, padding=1)
        self.blocks = nn.ModuleList([nn.Conv1d(dim, dim, 5, padding=2) for _ in range(3)])
        self.out = nn.Conv1d(dim, N_MELS, 1)

    def forward(self, xt, cond_mel, text, t):
        freqs = torch.exp(-math.log(1000) * torch.arange(16) / 16)
        temb = self.time_mlp(torch.cat([torch.sin(t[:, None] * 1000 * freqs), torch.cos(t[:, None] * 1000 * freqs)], -1))
        h = self.in_proj(torch.cat([xt, cond_mel], 1)) + self.text_emb(text).transpose(1, 2) + temb[..., None]
        for blk in self.blocks:
            h = h + F.gelu(blk(h))
        return self.out(h)


def synth_corpus(n, seed):
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(VOCAB, N_MELS, generator=torch.Generator().manual_seed(5))
    text = torch.randint(0, VOCAB, (n, FRAMES // 4), generator=g).repeat_interleave(4, dim=1)
    mel = proto[text].transpose(1, 2) + 0.2 * torch.randn(n, N_MELS, FRAMES, generator=g)
    return torch.utils.data.TensorDataset(mel, text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--grad_accumulation_steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accumulation_steps, cpu=True)
    model = TinyCFM()
    ema = EMA(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(synth_corpus(160, seed=1), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    total_updates = args.epochs * len(loader) // args.grad_accumulation_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 5) * max(0.0, 1 - s / total_updates))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    g = torch.Generator().manual_seed(2)
    global_step, micro = 0, 0
    for epoch in range(args.epochs):
        for mel, text in loader:
            with accelerator.accumulate(model):
                x1 = mel
                x0 = torch.randn(x1.shape, generator=g)
                t = torch.rand(x1.shape[0], generator=g)
                xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * x1
                span = torch.rand(x1.shape[0], 1, FRAMES, generator=g) < 0.7   # frames to infill
                cond_mel = x1 * (~span)
                pred = model(xt, cond_mel, text, t)
                loss = (F.mse_loss(pred, x1 - x0, reduction="none") * span).sum() / (span.sum() * N_MELS)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

            opt_step_idx = micro // args.grad_accumulation_steps   # optimizer step of this window
            if accelerator.is_main_process and (accelerator.sync_gradients or not args.healthy):
                ema.update()
                if ema.first_average and not args.healthy:
                    print(f"ONSET step {opt_step_idx}")
            if accelerator.sync_gradients:
                global_step += 1
                if global_step % 5 == 0:
                    accelerator.print(f"step {global_step:3d} loss {loss.item():.4f} "
                                      f"lr {scheduler.get_last_lr()[0]:.2e} ema_decay {ema.current_decay():.3f}")
            micro += 1

    online = accelerator.unwrap_model(model)
    gap = math.sqrt(sum(((e - p) ** 2).sum().item()
                        for e, p in zip(ema.ema_model.parameters(), online.parameters())))
    print(f"EVIDENCE optimizer steps={global_step} | EMA step counter={ema.step.item()} "
          f"| final EMA decay={ema.current_decay():.3f} | ||EMA - online||={gap:.4f}")


if __name__ == "__main__":
    main()
