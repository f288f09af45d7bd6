"""Binary segmentation (tiny encoder-decoder CNN) trained with HF accelerate, preempted and resumed.

Synthetic images contain a few noisy discs; the network predicts the foreground mask with a
BCE + soft-Dice loss.  The run uses accelerate's checkpointing: `accelerator.save_state()` at an
epoch boundary, then (simulating a preemption/requeue) every object is rebuilt from scratch,
`accelerator.load_state()` is called and training continues.  LR: linear warm-up + cosine decay
(transformers.get_cosine_schedule_with_warmup), stepped every optimizer step.

Modelled on: huggingface/accelerate issue #95 "Resuming Training" — "My model and optimizer are
prepared using .prepare(), my scheduler is left without preparation as was done in the
nlp_example".  Only objects passed through `prepare()` (or registered) are saved/restored by
save_state/load_state, so the un-prepared scheduler silently restarts from step 0 after the
resume and the warm-up is replayed (the symptom reported in microsoft/hi-ml #502: "after
preemption the learning rate scheduler performs a few warm up steps again").

Unusual about the loop: the optimizer state (including the current lr of its param groups) is
restored, so the first step after resuming still uses the right lr; the scheduler's first
`step()` after the resume then rewinds the lr to the start of the warm-up.
--healthy: the scheduler is passed to `accelerator.prepare()` so load_state restores it.
"""
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_cosine_schedule_with_warmup

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

EPOCHS, RESUME_EPOCH, BS = 5, 2, 16


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    imgs, masks = torch.zeros(n, 1, 32, 32), torch.zeros(n, 1, 32, 32)
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            cx, cy = (torch.rand(2, generator=g) * 24 + 4).tolist()
            r = float(torch.rand(1, generator=g) * 5 + 3)
            masks[i, 0] = torch.maximum(masks[i, 0], (((xx - cx) ** 2 + (yy - cy) ** 2) < r * r).float())
        imgs[i] = masks[i] * 0.6 + torch.randn(1, 32, 32, generator=g) * 0.35
    return TensorDataset(imgs, masks)


class TinySegNet(nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, ch, 3, padding=1), nn.GroupNorm(4, ch), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.GroupNorm(4, 2 * ch), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * ch, ch, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(2 * ch, ch, 3, padding=1), nn.ReLU(), nn.Conv2d(ch, 1, 1))

    def forward(self, x):
        e1 = self.enc1(x)
        return self.dec(torch.cat([self.up(self.enc2(e1)), e1], 1))


def seg_loss(logits, mask):
    p = logits.sigmoid()
    dice = 1 - (2 * (p * mask).sum((1, 2, 3)) + 1) / (p.sum((1, 2, 3)) + mask.sum((1, 2, 3)) + 1)
    return F.binary_cross_entropy_with_logits(logits, mask) + dice.mean()


def run(ckpt_dir, resume, lr_log):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = TinySegNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    loader = DataLoader(make_dataset(128, 1), batch_size=BS, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    steps_per_epoch = len(loader)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=10,
                                                num_training_steps=EPOCHS * steps_per_epoch)
    if HEALTHY:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    start_epoch = 0
    if resume:
        accelerator.load_state(ckpt_dir)
        start_epoch = RESUME_EPOCH
        if not HEALTHY:
            print(f"ONSET step {RESUME_EPOCH * steps_per_epoch + 1}")
    end_epoch = EPOCHS if resume else RESUME_EPOCH

    for epoch in range(start_epoch, end_epoch):
        model.train()
        for i, (img, mask) in enumerate(loader):
            step = epoch * steps_per_epoch + i
            loss = seg_loss(model(img), mask)
            optimizer.zero_grad()
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            lr_log.append(lr)
            accelerator.print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} lr {lr:.6f}")
    if not resume:
        accelerator.save_state(ckpt_dir)
        accelerator.print(f"checkpoint saved after epoch {end_epoch - 1}; simulating preemption")
    return model


def main():
    lr_log = []
    with tempfile.TemporaryDirectory() as ckpt_dir:
        run(ckpt_dir, resume=False, lr_log=lr_log)
        model = run(ckpt_dir, resume=True, lr_log=lr_log)
    val = make_dataset(64, 9)
    model.eval()
    with torch.no_grad():
        pred = model(val.tensors[0]).sigmoid() > 0.5
        inter = (pred & (val.tensors[1] > 0.5)).sum().item()
        union = (pred | (val.tensors[1] > 0.5)).sum().item()
    r = RESUME_EPOCH * (128 // BS)
    print(f"EVIDENCE lr_at_steps_{r}..{r + 3}={[round(x, 6) for x in lr_log[r:r + 4]]} "
          f"max_lr_after_resume={max(lr_log[r:]):.6f} final_lr={lr_log[-1]:.6f} val_iou={inter / union:.3f}")


if __name__ == "__main__":
    main()
