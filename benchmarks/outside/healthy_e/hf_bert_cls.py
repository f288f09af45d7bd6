"""Sequence classification with a tiny BERT and the Hugging Face ``Trainer``.

Modelled on the Hugging Face course, chapter 3 "Fine-tuning a model with the
Trainer API" and ``examples/pytorch/text-classification/run_glue.py``:
``BertForSequenceClassification`` + ``TrainingArguments`` + ``Trainer`` with a
``compute_metrics`` accuracy function, evaluation every epoch, a linear LR
schedule with warm-up, weight decay, gradient accumulation, per-epoch
checkpoints with ``load_best_model_at_end`` on the eval accuracy, and a final
``trainer.evaluate()``.

No pretrained weights or tokenizer: the model is built from a small
``BertConfig`` and the dataset is synthetic token sequences (padded, with
attention masks) whose label says whether the 1-3 marker tokens hidden at
random positions come from the "positive" or the "negative" marker set.  512
examples, batch 16 x 2 accumulation steps, 4 epochs = 64 optimizer steps.
"""
import argparse
import tempfile

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
set_seed(42)

VOCAB, MAX_LEN, PAD = 64, 24, 0
POS_TOKENS, NEG_TOKENS = [5, 6, 7], [8, 9, 10]


class MarkerDataset(Dataset):
    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.examples = []
        for _ in range(n):
            length = int(rng.integers(8, MAX_LEN + 1))
            ids = rng.integers(11, VOCAB, size=length)
            label = int(rng.integers(0, 2))
            n_markers = int(rng.integers(1, 4))
            slots = rng.choice(np.arange(1, length), size=n_markers, replace=False)
            ids[slots] = rng.choice(POS_TOKENS if label else NEG_TOKENS, size=n_markers)
            ids[0] = 1  # [CLS]
            input_ids = np.full(MAX_LEN, PAD)
            input_ids[:length] = ids
            attention_mask = (np.arange(MAX_LEN) < length).astype(np.int64)
            self.examples.append({
                "input_ids": torch.tensor(input_ids, dtype=torch.long),
                "attention_mask": torch.tensor(attention_mask, dtype=torch.long),
                "labels": torch.tensor(label, dtype=torch.long),
            })

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    return {"accuracy": float((predictions == labels).mean())}


config = BertConfig(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=128, max_position_embeddings=MAX_LEN, num_labels=2, pad_token_id=PAD,
)
model = BertForSequenceClassification(config)

train_dataset = MarkerDataset(512, seed=1)
eval_dataset = MarkerDataset(256, seed=2)

with tempfile.TemporaryDirectory() as output_dir:
    training_args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=4,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        weight_decay=0.01,
        warmup_ratio=0.1,
        lr_scheduler_type="linear",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        logging_steps=8,
        report_to=[],
        use_cpu=True,
        seed=42,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
    )
    print("before training:", trainer.evaluate())
    train_result = trainer.train()
    print(f"global steps: {train_result.global_step}, train loss: {train_result.training_loss:.4f}")
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    print("logged training losses:", [round(x, 4) for x in losses])
    print("after training (best checkpoint):", trainer.evaluate())
