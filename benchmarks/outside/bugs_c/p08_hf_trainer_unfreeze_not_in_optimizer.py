"""P08 (class: parameters unfrozen mid-training are never optimised -- requires_grad flipped to True, but the
optimizer was built only over the parameters that were trainable at creation time) -- HuggingFace Trainer.

Modelled on fastai/fastai#2133 "Redundant code in Learner.freeze and Learner.unfreeze", where sgugger explains
that "the optimizer needs to be created again because at creation, it only takes trainable parameters.  After
a freeze/unfreeze those change so it needs to be adjusted" -- the HF Trainer has the same property
(`Trainer.create_optimizer` keeps only `p.requires_grad` parameters), and the same trap is what Lightning's
`BaseFinetuning.unfreeze_and_add_param_group` exists to avoid.  (Related: keras-team/keras#3268 "froze layer,
but weights still changed" -- changing trainability from a callback did not take effect.)

Program: a small BERT sequence classifier fine-tuned with `Trainer`: embeddings + encoder start frozen, and a
ULMFiT-style GradualUnfreezingCallback unfreezes the encoder layers at step 12 and the embeddings at step 24 by
setting requires_grad=True.  Gradients now flow into those layers (and show up in grad_norm), but the
optimizer never updates them.  Healthy twin: the callback also adds the newly unfrozen parameters to the
optimizer (new param group that follows the LR schedule).
"""
import argparse
import logging
import warnings
import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments,
                          set_seed)
from transformers.utils import logging as hf_logging

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
HEALTHY = args.healthy
warnings.filterwarnings("ignore")
hf_logging.set_verbosity_error()
logging.getLogger("accelerate").setLevel(logging.ERROR)
set_seed(0)
torch.manual_seed(0)

VOCAB, SEQ_LEN, NUM_LABELS = 120, 24, 3
indicator = torch.arange(10, 10 + NUM_LABELS * 6).view(NUM_LABELS, 6)  # class-specific cue tokens


class CueDataset(Dataset):
    """[CLS] + noise tokens with 8 cue tokens of the label's class and 2 distractor cues of another class."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, NUM_LABELS, (n,), generator=g)
        ids = torch.randint(40, VOCAB, (n, SEQ_LEN), generator=g)
        for i in range(n):
            pos = torch.randperm(SEQ_LEN - 1, generator=g)[:10] + 1
            y = int(self.labels[i])
            other = (y + 1 + int(torch.randint(0, NUM_LABELS - 1, (1,), generator=g))) % NUM_LABELS
            ids[i, pos[:8]] = indicator[y][torch.randint(0, 6, (8,), generator=g)]
            ids[i, pos[8:]] = indicator[other][torch.randint(0, 6, (2,), generator=g)]
        ids[:, 0] = 2  # [CLS]
        self.ids = ids

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=SEQ_LEN, num_labels=NUM_LABELS,
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
model = BertForSequenceClassification(config)

# stage 0: train the classifier head (and pooler) only
for name, param in model.named_parameters():
    param.requires_grad = name.startswith(("classifier", "bert.pooler"))


class GradualUnfreezingCallback(TrainerCallback):
    """ULMFiT-style gradual unfreezing: {global_step: [parameter-name prefixes to unfreeze]}."""

    def __init__(self, schedule, lr_mult=1.0):
        self.schedule, self.lr_mult = schedule, lr_mult

    def on_step_begin(self, args, state, control, **kwargs):
        if not HEALTHY and state.global_step == min(self.schedule):
            print(f"ONSET step {state.global_step}")

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        prefixes = self.schedule.get(state.global_step)
        if not prefixes:
            return
        newly = [p for n, p in model.named_parameters() if n.startswith(tuple(prefixes)) and not p.requires_grad]
        for p in newly:
            p.requires_grad = True
        print(f"[unfreeze] after step {state.global_step}: {len(newly)} tensors "
              f"({sum(p.numel() for p in newly)} params) under {prefixes}")
        if HEALTHY:
            # the fix: hand the unfrozen parameters to the optimizer and the LR schedule
            base_lr = args.learning_rate * self.lr_mult
            sched = getattr(lr_scheduler, "scheduler", lr_scheduler)
            factor = sched.lr_lambdas[0](sched.last_epoch)
            optimizer.add_param_group({"params": newly, "lr": base_lr * factor, "weight_decay": args.weight_decay})
            sched.base_lrs.append(base_lr)
            sched.lr_lambdas.append(sched.lr_lambdas[0])


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


training_args = TrainingArguments(
    output_dir="p08_out", max_steps=36, per_device_train_batch_size=16, per_device_eval_batch_size=64,
    learning_rate=4e-3, weight_decay=0.01, warmup_steps=3, lr_scheduler_type="constant_with_warmup", max_grad_norm=1.0,
    eval_strategy="steps", eval_steps=12, logging_steps=4, save_strategy="steps", save_steps=36,
    save_total_limit=1, save_only_model=True, report_to="none", use_cpu=True, bf16=True, seed=0,
    disable_tqdm=True, dataloader_num_workers=0,
)
trainer = Trainer(
    model=model, args=training_args, train_dataset=CueDataset(36 * 16, seed=1),
    eval_dataset=CueDataset(192, seed=2), compute_metrics=compute_metrics,
    callbacks=[GradualUnfreezingCallback({12: ["bert.encoder.layer.1", "bert.encoder.layer.0"],
                                          24: ["bert.embeddings"]})],
)
trainer.train()
print("final:", trainer.evaluate())
