"""Gradual unfreezing via a Trainer callback, but the unfrozen encoder was never given to the optimizer.

Bug class: freezing / fine-tuning (parameters unfrozen after optimizer
creation are not in any param group).

Modelled on: facebookresearch/detectron2#2486 "How to unfreeze some weight
parameters at certain iteration during training?" -- the user set
``requires_grad = True`` on the box head at iteration 500 and "it seems that it
does not take effect", because the optimizer had been built from the trainable
parameters only.  fastai/fastai#2133 documents the same rule ("the optimizer
needs to be created again because at creation, it only takes trainable
parameters").  HF ``Trainer.create_optimizer`` also builds its param groups
from ``p.requires_grad`` parameters only.

What goes wrong: the encoder is frozen for a head-only warm-up, then a callback
flips ``requires_grad`` back on at step ``UNFREEZE_AT``.  From then on the
encoder receives gradients (which also enter the global grad-norm clipping and
so shrink the head's updates) but ``optimizer.step()`` never touches it -- the
encoder silently stays at its initial weights for the whole run.

Healthy twin: the callback also registers the newly trainable parameters with
the optimizer (``optimizer.add_param_group``), which is what the fine-tuning
callbacks in Lightning / fastai do.

Onset: the unfreeze happens in ``on_step_begin`` before optimizer step 15, so
K = 15.
"""
import sys
import tempfile

import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

VOCAB, SEQ_LEN, N_EXAMPLES = 50, 16, 160
UNFREEZE_AT = 15


class TopicDataset(torch.utils.data.Dataset):
    """Two "topics" with overlapping vocabularies; label = topic of the sequence."""

    def __init__(self, n, gen):
        labels = torch.randint(0, 2, (n,), generator=gen)
        low = torch.randint(10, 34, (n, SEQ_LEN), generator=gen)
        high = torch.randint(26, VOCAB, (n, SEQ_LEN), generator=gen)
        ids = torch.where(labels[:, None] == 1, high, low)
        ids[:, 0] = 1  # [CLS]
        self.ids, self.labels = ids, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long),
                "labels": self.labels[i]}


class GradualUnfreeze(TrainerCallback):
    def __init__(self, module, unfreeze_at):
        self.module = module
        self.unfreeze_at = unfreeze_at

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step != self.unfreeze_at:
            return
        params = list(self.module.parameters())
        for p in params:
            p.requires_grad_(True)  # BUG: these params are in no optimizer param group
        print(f"unfroze encoder ({sum(p.numel() for p in params)} params) at step {state.global_step}")
        if HEALTHY:
            optimizer.add_param_group({"params": params, "weight_decay": args.weight_decay})
            # keep the (constant) LambdaLR schedule in sync with the new param group
            lr_scheduler.base_lrs.append(args.learning_rate)
            lr_scheduler.lr_lambdas.append(lr_scheduler.lr_lambdas[0])
        else:
            print(f"ONSET step {state.global_step}")


train_ds = TopicDataset(N_EXAMPLES, torch.Generator().manual_seed(5))
config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ_LEN, num_labels=2)
model = BertForSequenceClassification(config)

# head-only warm-up: freeze embeddings + transformer layers
for p in model.bert.embeddings.parameters():
    p.requires_grad_(False)
for p in model.bert.encoder.parameters():
    p.requires_grad_(False)
n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"trainable parameters during warm-up: {n_trainable}")

encoder = torch.nn.ModuleList([model.bert.embeddings, model.bert.encoder])

with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      callbacks=[GradualUnfreeze(encoder, UNFREEZE_AT)])
    result = trainer.train()
    print(f"final train_loss {result.training_loss:.4f}")

print("done")
