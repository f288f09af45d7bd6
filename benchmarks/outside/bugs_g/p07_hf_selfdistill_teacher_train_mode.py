"""Self-distillation teacher attached as a submodule is flipped to train mode by the HF Trainer.

Bug class: teacher network silently put back into train mode (dropout active in
the teacher) because the parent module's ``.train()`` recurses into it.

Modelled on: tianweiy/DMD2#21 "set model to train mode" (the frozen teacher
UNet is a submodule of the guidance model, so calling ``.train()`` on the big
model also sets the teacher to train mode), YonghaoXu/SEANet#1 (teacher/student
mode switching forgotten) and vrvlive/knowlege-distillation#2 ("I don't see
.eval() called on the teacher").  The loop is a progressive self-distillation
recipe (born-again / PS-KD style) run with the HuggingFace ``Trainer``: epoch 0
is plain cross-entropy; at the start of epoch 1 a frozen snapshot of the student
becomes the teacher and the loss mixes CE with KL to the teacher's softened
predictions.

What goes wrong: the callback stores the snapshot as ``model.teacher`` and calls
``.eval()`` on it once.  Because it is now a registered submodule, the Trainer's
``model.train()`` at the top of every ``training_step`` switches the teacher's
dropout back on.  From the first distillation step on, the soft targets are
noisy dropout samples of the teacher instead of its deterministic predictions;
the loss still decreases and nothing is reported.

Healthy twin: the wrapper overrides ``train()`` so the teacher is kept in eval
mode whatever the Trainer does (the usual fix).

Onset: 128 examples / batch 8 = 16 optimizer steps per epoch; the teacher is
attached at the beginning of epoch 1, so the first affected update is the one
taken at global_step K = 16 (48 steps in total, 32 affected).
"""
import copy
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                          TrainerCallback, TrainingArguments)

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

VOCAB, SEQ_LEN, N_EX, N_CLASSES = 50, 24, 128, 3
KD_T, KD_ALPHA = 2.0, 0.5


def make_data(n, gen):
    ids = torch.randint(5, VOCAB, (n, SEQ_LEN), generator=gen)
    ids[:, 0] = 1  # [CLS]
    # class = which third of the vocabulary dominates the sequence
    bucket = (ids[:, 1:] - 5) * N_CLASSES // (VOCAB - 5)
    counts = torch.stack([(bucket == c).sum(1) for c in range(N_CLASSES)], 1)
    labels = counts.argmax(1)
    return ids, labels


class TokDataset(torch.utils.data.Dataset):
    def __init__(self, ids, labels):
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


class SelfDistillModel(nn.Module):
    def __init__(self, student):
        super().__init__()
        self.student = student
        self.teacher = None

    def train(self, mode=True):
        super().train(mode)
        if HEALTHY and self.teacher is not None:
            self.teacher.eval()
        return self

    def forward(self, input_ids, attention_mask, labels):
        logits = self.student(input_ids=input_ids, attention_mask=attention_mask).logits
        loss = F.cross_entropy(logits, labels)
        if self.teacher is not None:
            with torch.no_grad():
                t_logits = self.teacher(input_ids=input_ids, attention_mask=attention_mask).logits
            kd = F.kl_div(F.log_softmax(logits / KD_T, -1), F.softmax(t_logits / KD_T, -1),
                          reduction="batchmean") * KD_T ** 2
            loss = (1 - KD_ALPHA) * loss + KD_ALPHA * kd
        return {"loss": loss, "logits": logits}


class AttachTeacher(TrainerCallback):
    def __init__(self, wrapper):
        self.wrapper = wrapper

    def on_epoch_begin(self, args, state, control, **kwargs):
        if round(state.epoch or 0) == 1 and self.wrapper.teacher is None:
            teacher = copy.deepcopy(self.wrapper.student)
            teacher.requires_grad_(False)
            teacher.eval()
            self.wrapper.teacher = teacher  # registered as a submodule
            print(f"teacher snapshot taken at step {state.global_step}")
            if not HEALTHY:
                print(f"ONSET step {state.global_step}")


ids, labels = make_data(N_EX, torch.Generator().manual_seed(7))
train_ds = TokDataset(ids, labels)
config = BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=96, max_position_embeddings=SEQ_LEN, num_labels=N_CLASSES,
                    hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
model = SelfDistillModel(BertForSequenceClassification(config))

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp, per_device_train_batch_size=8, num_train_epochs=3, learning_rate=2e-3,
        weight_decay=0.01, warmup_steps=4, logging_steps=8, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      callbacks=[AttachTeacher(model)])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
