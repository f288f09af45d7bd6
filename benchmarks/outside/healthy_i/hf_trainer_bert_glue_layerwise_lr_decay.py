"""Sequence classification with the HF Trainer, layer-wise LR decay and mid-epoch eval.

Modelled on: huggingface/transformers ``examples/pytorch/text-classification/run_glue.py``
(dataclass arguments, ``Trainer`` + ``compute_metrics`` + ``EvalPrediction``), with
the optimizer built outside the Trainer and passed via ``optimizers=(optimizer,
scheduler)`` to get layer-wise learning-rate decay (LLRD, as in ELECTRA / the Kaggle
"layer-wise LR decay" recipes): each encoder layer's LR is ``lr * decay**depth`` from
the top, the embeddings get the smallest, the classifier head the full LR, and
bias/LayerNorm parameters have no weight decay.

What is unusual about the loop (all intentional):
  * 12 parameter groups with different learning rates, several of them small;
  * linear warm-up that starts from lr = 0, so the first optimizer step changes nothing;
  * evaluation every 10 steps, i.e. several times in the middle of the (single) epoch;
  * the model is built from a small ``BertConfig`` (no pretrained weights).
"""
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    EvalPrediction,
    Trainer,
    TrainingArguments,
    get_linear_schedule_with_warmup,
    set_seed,
)

torch.set_num_threads(1)


@dataclass
class ModelArguments:
    vocab_size: int = 200
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_labels: int = 3
    learning_rate: float = 3e-3
    layer_decay: float = 0.85
    weight_decay: float = 0.01
    warmup_steps: int = 6
    max_steps: int = 40


class SyntheticSentiment(Dataset):
    """Label = which of three 'keyword' sets occurs most often in the sentence."""

    def __init__(self, n, seq_len=32, vocab=200, seed=0):
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(40, vocab, size=(n, seq_len))
        keys = [np.arange(10, 20), np.arange(20, 30), np.arange(30, 40)]
        for i in range(n):
            c = rng.integers(0, 3)
            pos = rng.choice(seq_len - 1, size=4, replace=False) + 1
            self.ids[i, pos] = rng.choice(keys[c], size=4)
        self.ids[:, 0] = 2  # [CLS]
        counts = np.stack([np.isin(self.ids, k).sum(1) for k in keys], 1)
        self.labels = counts.argmax(1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = torch.tensor(self.ids[i])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "labels": torch.tensor(int(self.labels[i]))}


def llrd_param_groups(model, args):
    no_decay = ("bias", "LayerNorm.weight")
    n_layers = model.config.num_hidden_layers
    groups = []

    def add(named, lr):
        dec = [p for n, p in named if not any(nd in n for nd in no_decay)]
        nodec = [p for n, p in named if any(nd in n for nd in no_decay)]
        if dec:
            groups.append({"params": dec, "lr": lr, "weight_decay": args.weight_decay})
        if nodec:
            groups.append({"params": nodec, "lr": lr, "weight_decay": 0.0})

    head = [(n, p) for n, p in model.named_parameters()
            if n.startswith("classifier") or "pooler" in n]
    add(head, args.learning_rate)
    for layer_idx in range(n_layers - 1, -1, -1):
        depth = n_layers - layer_idx
        named = [(n, p) for n, p in model.named_parameters()
                 if f"encoder.layer.{layer_idx}." in n]
        add(named, args.learning_rate * args.layer_decay ** depth)
    emb = [(n, p) for n, p in model.named_parameters() if "embeddings" in n]
    add(emb, args.learning_rate * args.layer_decay ** (n_layers + 1))
    return groups


def compute_metrics(p: EvalPrediction):
    preds = np.argmax(p.predictions, axis=1)
    return {"accuracy": float((preds == p.label_ids).mean())}


def main():
    args = ModelArguments()
    set_seed(0)
    config = BertConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                        num_hidden_layers=args.num_hidden_layers, num_attention_heads=4,
                        intermediate_size=4 * args.hidden_size, max_position_embeddings=64,
                        num_labels=args.num_labels)
    model = BertForSequenceClassification(config)

    train_ds = SyntheticSentiment(1280, seed=1)
    eval_ds = SyntheticSentiment(256, seed=2)

    groups = llrd_param_groups(model, args)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup_steps, args.max_steps)

    with tempfile.TemporaryDirectory() as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=32,
            per_device_eval_batch_size=64,
            max_steps=args.max_steps,
            eval_strategy="steps",
            eval_steps=10,
            logging_steps=5,
            max_grad_norm=1.0,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            compute_metrics=compute_metrics,
            optimizers=(optimizer, scheduler),
        )
        result = trainer.train()
        metrics = trainer.evaluate()
        print(f"train_loss {result.training_loss:.4f} eval {metrics}")


if __name__ == "__main__":
    main()
