"""Sequence classification with the HF Trainer and a sequence-length curriculum callback.

A small BERT (built from a config) classifies synthetic token sequences: the label says whether
a "marker" token occurs anywhere in the 64-token sequence.  Following the usual length
warm-up recipe, epoch 0 trains on sequences truncated to 16 tokens and a TrainerCallback is
supposed to switch the training data to full-length sequences from epoch 1 on.

Modelled on: huggingface/transformers issue #25925 "Edit train_dataloader in callbacks" — the
reporter's callback did `kwargs['train_dataloader'] = new_dataloader` in `on_epoch_begin`; the
Trainer keeps its own local `train_dataloader` in `_inner_training_loop`, so the assignment
"doesn't affect the dataloader as expected" and training silently continues on the old data.

Unusual about the loop: nothing changes in epoch 0; from the first step of epoch 1 the model
should see 64-token inputs but keeps getting the 16-token curriculum stage.
--healthy: the callback mutates the dataset object that the Trainer's dataloader is already
iterating (`train_dataloader.dataset.max_len = 64`), which does take effect.
"""
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

FULL_LEN, SHORT_LEN, MARKER, PAD = 64, 16, 5, 0


class MarkerDataset(Dataset):
    def __init__(self, n, seed, max_len):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(10, 64, (n, FULL_LEN), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        pos = torch.randint(0, FULL_LEN, (n, 4), generator=g)      # up to 4 markers per positive
        for i in torch.nonzero(self.labels).flatten():
            self.tokens[i, pos[i]] = MARKER
        self.max_len = max_len

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = self.tokens[i, :self.max_len]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


def collate(features):
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), n), PAD)
    mask = torch.zeros(len(features), n, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = f["input_ids"]
        mask[i, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([f["labels"] for f in features])}


class LengthCurriculum(TrainerCallback):
    def __init__(self, switch_epoch, full_len, batch_size):
        self.switch_epoch, self.full_len, self.batch_size = switch_epoch, full_len, batch_size

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if round(state.epoch) != self.switch_epoch:
            return
        if HEALTHY:
            train_dataloader.dataset.max_len = self.full_len
        else:
            full = MarkerDataset(len(train_dataloader.dataset), seed=1, max_len=self.full_len)
            kwargs["train_dataloader"] = DataLoader(full, batch_size=self.batch_size, shuffle=True,
                                                    collate_fn=collate)
            print(f"ONSET step {state.global_step}")


class TokenCountingTrainer(Trainer):
    tokens_per_sample = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.tokens_per_sample.append(inputs["attention_mask"].sum(1).float().mean().item())
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def main():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=FULL_LEN, num_labels=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    train_ds = MarkerDataset(256, seed=1, max_len=SHORT_LEN)
    eval_ds = MarkerDataset(128, seed=2, max_len=FULL_LEN)
    bs = 16
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=bs, per_device_eval_batch_size=64,
                                 num_train_epochs=3, learning_rate=3e-3, warmup_steps=2, weight_decay=0.01,
                                 logging_steps=1, eval_strategy="epoch", save_strategy="no",
                                 report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        trainer = TokenCountingTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                                       data_collator=collate,
                                       callbacks=[LengthCurriculum(1, FULL_LEN, bs)])
        trainer.train()
        metrics = trainer.evaluate()
    seen = trainer.tokens_per_sample
    steps_per_epoch = len(seen) // 3
    later = seen[steps_per_epoch:]
    print(f"EVIDENCE mean_tokens_per_sample_epochs1to2={sum(later) / len(later):.1f} "
          f"(epoch0={sum(seen[:steps_per_epoch]) / steps_per_epoch:.1f}) optimizer_steps={trainer.state.global_step} "
          f"eval_loss={metrics['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
