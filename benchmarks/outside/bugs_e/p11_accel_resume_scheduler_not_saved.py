"""Resume with ``accelerator.load_state`` but the LR scheduler was never registered, so it restarts.

Bug class: checkpointing / resume (incomplete training state in the checkpoint).

Modelled on: lightly-ai/lightly-train#301 "Resume scheduler properly" ("the
learning rate will reset to the initial stage when resume_interrupted=True ...
the scheduler status is not saved and resumed properly, so last_epoch is always
equal to -1 when resumed from checkpoints") and huggingface/accelerate#137
"load scheduler to resume training"; see also XPixelGroup/BasicSR#327 ("when I
restart training from resume_state, learning_rate will not be updated").
``Accelerator.save_state`` / ``load_state`` only handle objects that went
through ``accelerator.prepare`` (or ``register_for_checkpointing``); a
scheduler that is created but not prepared is silently left out.

Setup: a job trains for 2 epochs (16 optimizer steps) with a linear
warm-up + linear decay schedule, saves its state with
``accelerator.save_state`` and is "pre-empted"; the restarted job rebuilds
model / optimizer / dataloader / scheduler and calls ``accelerator.load_state``
before continuing to 48 steps.

What goes wrong: model and optimizer (including the param groups' current lr)
are restored, but the scheduler comes back with ``last_epoch = 0``.  The first
step after the resume still uses the restored lr, then the next
``scheduler.step()`` drops the lr back to the beginning of warm-up and the whole
schedule is replayed shifted by 16 steps (never decays to zero).  Loss curves
look normal.

Healthy twin: passes the scheduler to ``accelerator.prepare`` so it is saved and
restored with the rest of the state.

Onset: resume happens at step 16; step 16 runs with the lr restored from the
optimizer state, step 17 is the first optimizer step with the wrong lr, K = 17.
"""
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

D, C = 20, 3
N_TRAIN, BATCH = 128, 16          # 8 optimizer steps per epoch
EPOCHS_FIRST_JOB = 2
EPOCHS_TOTAL = 6
STEPS_PER_EPOCH = N_TRAIN // BATCH
TOTAL_STEPS = EPOCHS_TOTAL * STEPS_PER_EPOCH
WARMUP_STEPS = 8
PEAK_LR = 3e-3

accelerator = Accelerator(cpu=True)
set_seed(0)

gen = torch.Generator().manual_seed(8)
x_all = torch.randn(N_TRAIN, D, generator=gen)
y_all = (x_all[:, :C] * 2 + 0.5 * torch.randn(N_TRAIN, C, generator=gen)).argmax(1)
dataset = TensorDataset(x_all, y_all)


def linear_warmup_decay(step):
    if step < WARMUP_STEPS:
        return step / WARMUP_STEPS
    return max(0.0, (TOTAL_STEPS - step) / (TOTAL_STEPS - WARMUP_STEPS))


def build_training_objects():
    model = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, C))
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True)
    if HEALTHY:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    else:
        # BUG: the scheduler is stepped by hand and never prepared/registered, so
        # save_state/load_state do not include it
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return model, optimizer, loader, scheduler


def run_epochs(model, optimizer, loader, scheduler, first_epoch, last_epoch, step):
    model.train()
    for epoch in range(first_epoch, last_epoch):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            if step % 4 == 0:
                print(f"step {step:3d} epoch {epoch} loss {loss.item():.4f} "
                      f"lr {optimizer.param_groups[0]['lr']:.3e}")
            step += 1
    return step


with tempfile.TemporaryDirectory() as tmp:
    ckpt_dir = os.path.join(tmp, "checkpoint")

    # ---- first job: train, checkpoint, get pre-empted ----
    model, optimizer, loader, scheduler = build_training_objects()
    step = run_epochs(model, optimizer, loader, scheduler, 0, EPOCHS_FIRST_JOB, 0)
    accelerator.save_state(ckpt_dir)
    print(f"saved checkpoint at step {step}")
    accelerator.free_memory()
    del model, optimizer, loader, scheduler

    # ---- restarted job: rebuild everything and resume ----
    model, optimizer, loader, scheduler = build_training_objects()
    accelerator.load_state(ckpt_dir)
    print(f"resumed from checkpoint at step {step}")
    if not HEALTHY:
        print(f"ONSET step {step + 1}")
    step = run_epochs(model, optimizer, loader, scheduler, EPOCHS_FIRST_JOB, EPOCHS_TOTAL, step)

print(f"finished after {step} optimizer steps")
print("done")
