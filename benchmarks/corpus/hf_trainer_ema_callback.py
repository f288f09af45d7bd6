"""Fine-tuning a tiny BERT classifier with the Hugging Face Trainer, keeping a weight EMA from a TrainerCallback.

Modelled on: the PyTorch docs for ``torch.optim.swa_utils`` (EMA section,
https://pytorch.org/docs/stable/optim.html#weight-averaging-swa-and-ema) and the transformers
``TrainerCallback`` docs (https://huggingface.co/docs/transformers/main_classes/callback)
Habits reproduced: a ``BertForSequenceClassification`` built from a small ``BertConfig``, a
``torch.utils.data.Dataset`` of dicts holding ``input_ids``/``attention_mask``/``labels``,
``TrainingArguments`` with ``gradient_accumulation_steps``, ``max_steps``, a linear schedule with
warm-up, ``report_to=[]``, ``save_strategy="no"`` and ``use_cpu=True``, a ``TrainerCallback`` that
builds an ``AveragedModel`` with ``get_ema_multi_avg_fn`` in ``on_train_begin``, calls
``update_parameters(model)`` in ``on_step_end`` (once per optimizer step, after accumulation) and
evaluates the EMA copy under ``torch.no_grad()`` in ``on_train_end``, then ``trainer.evaluate()``
of the trained model.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences; the label says whether low-id tokens outnumber high-id ones."""

    def __init__(self, n, seq_len, vocab_size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, vocab_size, (n, seq_len), generator=generator)
        lengths = torch.randint(seq_len // 2, seq_len + 1, (n,), generator=generator)
        self.attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
        self.input_ids = self.input_ids * self.attention_mask  # 0 is the pad id
        low = ((self.input_ids > 0) & (self.input_ids < vocab_size // 2)).sum(1)
        self.labels = (2 * low > lengths).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i], "labels": self.labels[i]}


class EMACallback(TrainerCallback):
    def __init__(self, eval_dataset, decay=0.99, batch_size=32):
        self.eval_dataset = eval_dataset
        self.decay = decay
        self.batch_size = batch_size
        self.ema_model = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.ema_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(self.decay))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.ema_model.update_parameters(model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        loader = torch.utils.data.DataLoader(self.eval_dataset, batch_size=self.batch_size)
        self.ema_model.eval()
        total_loss, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for batch in loader:
                out = self.ema_model(**batch)
                n = batch["labels"].numel()
                total_loss += out.loss.item() * n
                correct += (out.logits.argmax(-1) == batch["labels"]).sum().item()
                count += n
        print(f"EMA eval: loss {total_loss / count:.4f} accuracy {correct / count:.3f} "
              f"(averaged over {int(self.ema_model.n_averaged)} steps)")


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main():
    parser = argparse.ArgumentParser(description="Trainer fine-tuning with an EMA callback")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ema-decay", type=float, default=0.99)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    train_dataset = SyntheticTokens(128, args.seq_len, config.vocab_size, args.seed)
    eval_dataset = SyntheticTokens(64, args.seq_len, config.vocab_size, args.seed + 1)

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=32,
            gradient_accumulation_steps=2,
            max_steps=args.steps,
            learning_rate=args.lr,
            lr_scheduler_type="linear",
            warmup_steps=1,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            compute_metrics=compute_metrics,
            callbacks=[EMACallback(eval_dataset, decay=args.ema_decay)],
        )
        trainer.train()
        metrics = trainer.evaluate()
    print(f"eval: loss {metrics['eval_loss']:.4f} accuracy {metrics['eval_accuracy']:.3f}")


if __name__ == "__main__":
    main()
