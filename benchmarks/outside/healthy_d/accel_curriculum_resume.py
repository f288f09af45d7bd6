"""Modelled on huggingface/accelerate examples/by_feature/gradient_accumulation.py and
examples/by_feature/checkpointing.py (save_state / load_state, --resume_from_checkpoint
"step_N" / "epoch_N" folders, skip_first_batches), with a sequence-length curriculum in the
style of "curriculum learning by sequence length" (short sequences first, as in DeepSpeed's
seqlen warm-up).

Exercises: Accelerator(gradient_accumulation_steps=2) with `with accelerator.accumulate(model)`
so optimizer/scheduler steps happen only on sync steps; a collate function whose truncation
length grows each epoch (curriculum); a first job that stops mid-epoch after saving
accelerator state, and a second job that builds everything anew, load_state()s the
checkpoint, skips the already-seen batches of the interrupted epoch and finishes training.
GRU sequence classifier on synthetic sequences (label = whether the visible prefix contains a
spike above a threshold).
"""
import os
import shutil
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed, DataLoaderConfiguration

torch.set_num_threads(1)
OUT = "accel_curriculum_resume_ckpt"
CURRICULUM = {0: 8, 1: 16, 2: 32}  # epoch -> max sequence length


class SeqDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, 1, generator=g)
        self.y = (self.x.squeeze(-1) > 2.0).any(1).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Curriculum:
    def __init__(self):
        self.max_len = CURRICULUM[0]

    def __call__(self, batch):
        x = torch.stack([b[0] for b in batch])[:, :self.max_len]
        # the label must be computed on the visible prefix
        y = (x.squeeze(-1) > 2.0).any(1).long()
        return {"x": x, "labels": y}


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out.max(1).values)


def training_function(num_epochs=3, resume_from_checkpoint=None, stop_at_step=None):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(42)
    collate = Curriculum()
    train_dl = torch.utils.data.DataLoader(SeqDataset(384, 0), batch_size=16, shuffle=True, collate_fn=collate)
    eval_dl = torch.utils.data.DataLoader(SeqDataset(128, 1), batch_size=64, collate_fn=Curriculum())
    eval_dl.collate_fn.max_len = 32
    model = GRUClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-2, total_steps=num_epochs * len(train_dl) // 2)
    model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, lr_scheduler)

    overall_step, starting_epoch, resume_step = 0, 0, None
    if resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {resume_from_checkpoint}")
        accelerator.load_state(resume_from_checkpoint)
        training_difference = os.path.splitext(os.path.basename(resume_from_checkpoint))[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        else:
            resume_step = int(training_difference.replace("step_", ""))
            starting_epoch = resume_step // len(train_dl)
            resume_step -= starting_epoch * len(train_dl)
        overall_step = starting_epoch * len(train_dl) + (resume_step or 0)

    for epoch in range(starting_epoch, num_epochs):
        collate.max_len = CURRICULUM[epoch]
        train_dl.set_epoch(epoch)
        model.train()
        if resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dl, resume_step)
        else:
            active_dataloader = train_dl
        for batch in active_dataloader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(batch["x"]), batch["labels"])
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            overall_step += 1
            if overall_step % 12 == 0:
                accelerator.print(f"epoch {epoch} step {overall_step} len {collate.max_len} loss {loss.item():.4f} "
                                  f"lr {lr_scheduler.get_last_lr()[0]:.5f} (scheduler step {lr_scheduler.scheduler.last_epoch})")
            if stop_at_step is not None and overall_step == stop_at_step:
                output_dir = os.path.join(OUT, f"step_{overall_step}")
                accelerator.save_state(output_dir)
                accelerator.print(f"job pre-empted, state saved to {output_dir}")
                return output_dir
        model.eval()
        correct = 0
        for batch in eval_dl:
            with torch.no_grad():
                preds = model(batch["x"]).argmax(-1)
            preds, refs = accelerator.gather_for_metrics((preds, batch["labels"]))
            correct += (preds == refs).sum().item()
        accelerator.print(f"epoch {epoch}: eval accuracy (full length) {correct / len(eval_dl.dataset):.3f}")
        accelerator.save_state(os.path.join(OUT, f"epoch_{epoch}"))
    accelerator.end_training()


shutil.rmtree(OUT, ignore_errors=True)
ckpt = training_function(stop_at_step=36)          # first job: dies in the middle of epoch 1
training_function(resume_from_checkpoint=ckpt)     # second job: resumes and finishes
shutil.rmtree(OUT, ignore_errors=True)
