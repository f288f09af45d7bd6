"""Fine-tuning a three-way BERT sentence-pair classifier with ``transformers.Trainer``.

Modelled on: Hugging Face's text-classification example
(huggingface/transformers examples/pytorch/text-classification/run_glue.py) and the
"Fine-tune a pretrained model" tutorial.  Habits reproduced: a model built from a
``BertConfig`` with ``id2label``/``label2id``, a map-style ``Dataset`` yielding dicts with a
``label`` key (the Trainer renames it), ``token_type_ids`` for the sentence pair, a
``compute_metrics`` over ``EvalPrediction`` with numpy argmax, ``TrainingArguments`` with
warm-up, cosine decay, weight decay and ``max_grad_norm``, periodic evaluation, and a
final ``trainer.evaluate()`` plus ``save_model`` into the output directory.
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    EvalPrediction,
    Trainer,
    TrainingArguments,
    set_seed,
)

LABELS = ["contradiction", "neutral", "entailment"]
VOCAB_SIZE = 96
HALF = 8  # tokens per sentence; the pair is [CLS] a [SEP] b [SEP]
CLS_ID, SEP_ID = 1, 2


class PairDataset(torch.utils.data.Dataset):
    """Sentence pairs whose label is how many of their first two tokens match."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.first = torch.randint(3, VOCAB_SIZE, (n, HALF), generator=g)
        self.second = torch.randint(3, VOCAB_SIZE, (n, HALF), generator=g)
        copy = torch.randint(0, 3, (n,), generator=g)
        for i in range(n):
            self.second[i, : copy[i]] = self.first[i, : copy[i]]
        self.labels = copy

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ids = torch.cat([torch.tensor([CLS_ID]), self.first[i], torch.tensor([SEP_ID]),
                         self.second[i], torch.tensor([SEP_ID])])
        segments = torch.cat([torch.zeros(HALF + 2, dtype=torch.long), torch.ones(HALF + 1, dtype=torch.long)])
        return {
            "input_ids": ids,
            "token_type_ids": segments,
            "attention_mask": torch.ones_like(ids),
            "label": int(self.labels[i]),
        }


def compute_metrics(p: EvalPrediction):
    preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
    preds = np.argmax(preds, axis=1)
    return {"accuracy": float((preds == p.label_ids).astype(np.float32).mean())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval-steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=4e-4)
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (autocast), run_glue's --bf16")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each layer's activations in the backward (run_glue's flag of that name)")
    args = parser.parse_args()

    set_seed(args.seed)
    config = BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=2 * HALF + 3, type_vocab_size=2,
        num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)}, finetuning_task="nli",
    )
    model = BertForSequenceClassification(config)

    train_dataset = PairDataset(384, args.seed)
    eval_dataset = PairDataset(32, args.seed + 1000)

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.steps,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=16,
            learning_rate=args.learning_rate,
            weight_decay=0.01,
            warmup_steps=2,
            lr_scheduler_type="cosine",
            max_grad_norm=1.0,
            eval_strategy="steps",
            eval_steps=args.eval_steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=args.seed,
            gradient_checkpointing=args.gradient_checkpointing,
            bf16=args.bf16,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            compute_metrics=compute_metrics,
        )
        train_result = trainer.train()
        metrics = train_result.metrics
        metrics.update(trainer.evaluate())
        trainer.save_model()
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})


if __name__ == "__main__":
    main()
