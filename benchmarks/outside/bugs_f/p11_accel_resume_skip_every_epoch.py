"""SFT loop (accelerate) whose mid-epoch resume skips the first batches of *every* later epoch.

Bug class: data pipeline on resume (batches skipped to fast-forward a resumed
epoch keep being skipped in the following epochs, so part of the data is never
seen again).

Modelled on: allenai/open-instruct PR #681 "fix: only skip batches once on
resume" ("The current logic causes `resume_step` batches to be skipped every
epoch") in ``open_instruct/finetune.py``, an accelerate SFT script: on resume it
computes ``starting_epoch`` and ``resume_step`` from the checkpoint name and,
inside the epoch loop, uses ``accelerator.skip_first_batches(train_dataloader,
resume_step)`` whenever a checkpoint was given; ``resume_step`` was never
cleared.  The program here has the same shape: a tiny causal LM fine-tuned on
prompt/response pairs (prompt tokens masked with -100), AdamW with a linear
schedule, ``accelerator.save_state`` every 11 steps; the first run is cut off
right after the step-22 checkpoint (job time limit) and a second run in the
same process resumes from it with ``accelerator.load_state``.

What goes wrong: the resumed epoch correctly skips its first 6 batches.  Every
later epoch skips them too: the first 6 batches of each epoch's shuffled order
are dropped, the epoch has 10 instead of 16 updates, and 6 of every 16 batches
(37%) are never trained on again (the LR schedule still assumes 64 steps).

Healthy twin: ``resume_step`` is cleared after the resumed epoch's skip (the
fix of the PR).

Onset: 64 examples / batch 4 = 16 optimizer steps per epoch.  Run 1 stops after
step 22 (epoch 1, batch 6); run 2 finishes epoch 1 with steps 22-31, and the
first step of epoch 2, whose batch differs, is optimizer step K = 32.  The bug
then runs steps 32-51 (healthy: 32-63).
"""
import math
import os
import sys
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

PAD_ID, SEP_ID = 0, 1
VOCAB = 40
N_EXAMPLES = 64
BATCH = 4
GRAD_ACC = 1
EPOCHS = 4
CHECKPOINT_EVERY = 11
STOP_AFTER = 22  # first run's time limit (just after a checkpoint)
SEED = 1234


class PairDataset(Dataset):
    """prompt: a few tokens; response: the same tokens, each shifted by one id."""

    def __init__(self, n):
        gen = torch.Generator().manual_seed(99)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 9, (1,), generator=gen))
            prompt = torch.randint(2, VOCAB, (length,), generator=gen)
            response = torch.where(prompt + 1 < VOCAB, prompt + 1, torch.full_like(prompt, 2))
            ids = torch.cat([prompt, torch.tensor([SEP_ID]), response])
            labels = ids.clone()
            labels[:length + 1] = -100
            self.items.append((ids, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), PAD_ID)
    labels = torch.full((len(batch), width), -100)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, :len(ids)] = ids
        labels[i, :len(ids)] = lab
        attention_mask[i, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def last_checkpoint(output_dir):
    steps = [int(d.split("_")[1]) for d in os.listdir(output_dir) if d.startswith("step_")]
    return os.path.join(output_dir, f"step_{max(steps)}") if steps else None


def train(output_dir, stop_after=None):
    set_seed(SEED)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=GRAD_ACC)
    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=2, n_head=2,
                        bos_token_id=SEP_ID, eos_token_id=SEP_ID)
    model = GPT2LMHeadModel(config)
    train_dataloader = DataLoader(PairDataset(N_EXAMPLES), batch_size=BATCH, shuffle=True, collate_fn=collate)

    no_decay = ["bias", "ln_"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=3e-3)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / GRAD_ACC)
    max_train_steps = EPOCHS * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=max_train_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    checkpoint = last_checkpoint(output_dir)
    completed_steps, starting_epoch, resume_step = 0, 0, None
    if checkpoint is not None:
        accelerator.print(f"resuming from {os.path.basename(checkpoint)}")
        accelerator.load_state(checkpoint)
        completed_steps = int(os.path.basename(checkpoint).split("_")[1])
        starting_epoch = completed_steps // num_update_steps_per_epoch
        resume_step = (completed_steps % num_update_steps_per_epoch) * GRAD_ACC

    total_loss, n_logged = 0.0, 0
    for epoch in range(starting_epoch, EPOCHS):
        model.train()
        if checkpoint is not None and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            if HEALTHY:
                resume_step = None
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            if (not HEALTHY and checkpoint is not None and epoch == starting_epoch + 1 and step == 0
                    and accelerator.sync_gradients):
                accelerator.print(f"ONSET step {completed_steps}")
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                total_loss += loss.detach().float().item()
                n_logged += 1
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                if completed_steps % 8 == 0:
                    accelerator.print(f"step {completed_steps} epoch {epoch} loss {total_loss / n_logged:.4f}")
                    total_loss, n_logged = 0.0, 0
                if completed_steps % CHECKPOINT_EVERY == 0:
                    accelerator.save_state(os.path.join(output_dir, f"step_{completed_steps}"), safe_serialization=False)
                if stop_after is not None and completed_steps >= stop_after:
                    accelerator.print(f"time limit reached after step {completed_steps}")
                    return completed_steps
    accelerator.print(f"finished after {completed_steps} optimizer steps")
    return completed_steps


with tempfile.TemporaryDirectory() as out:
    train(out, stop_after=STOP_AFTER)
    train(out)
print("done")
