"""R-Drop fine-tuning of a small BERT classifier with a subclassed HF Trainer.

Modelled on: dropreg/R-Drop (Liang et al., "R-Drop: Regularized Dropout for Neural
Networks", NeurIPS 2021): the ``compute_kl_loss`` snippet of its README (symmetric
KL between the two dropout passes, ``loss = ce + alpha * kl``) and its fairseq
criterion, which duplicates the batch (``torch.cat([x, x])``) so that a single forward
pass yields two differently-dropped-out predictions per example.  The Trainer subclass
overrides ``compute_loss`` as in the transformers docs "Customize the Trainer".

What is unusual about the loop (all on purpose):
  * every batch is fed twice inside one forward; the two halves differ only through
    dropout, and the KL term between them is part of the training loss;
  * in eval mode dropout is off, the two passes would be identical (KL = 0), so the
    overridden ``compute_loss`` does a single plain pass there;
  * non-reentrant gradient checkpointing is on: dropout masks are replayed from the
    saved RNG state during recomputation, so the recomputed activations match;
  * the loss sits on a plateau near log 2 for about 30 steps before the model finds the
    sentiment tokens, and the KL term is tiny (1e-4) until then;
  * KL weight alpha is ramped up over the first 10 steps; LR warms up from 0;
    evaluation every 15 steps (mid-epoch; 40 steps per epoch).
"""
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed

torch.set_num_threads(1)
set_seed(0)

VOCAB, PAD, CLS, SEP = 120, 0, 1, 2
POSITIVE, NEGATIVE = list(range(10, 20)), list(range(20, 30))


def make_reviews(n, seed):
    """Synthetic reviews: filler tokens plus 6 sentiment tokens, mostly (80%) of the label's polarity."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        label = int(torch.randint(0, 2, (1,), generator=g))
        length = int(torch.randint(8, 16, (1,), generator=g))
        ids = torch.randint(30, VOCAB, (length,), generator=g)
        slots = torch.randperm(length, generator=g)[:6]
        agrees = torch.rand(6, generator=g) < 0.8
        is_pos = agrees if label == 1 else ~agrees
        words = torch.randint(0, 10, (6,), generator=g)
        ids[slots] = torch.where(is_pos, torch.tensor(POSITIVE)[words], torch.tensor(NEGATIVE)[words])
        examples.append({"input_ids": [CLS] + ids.tolist() + [SEP], "labels": label})
    return examples


class ListDataset(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad_collator(features):
    max_len = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((len(features), max_len), PAD, dtype=torch.long)
    for i, f in enumerate(features):
        input_ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(),
            "labels": torch.tensor([f["labels"] for f in features])}


def compute_kl_loss(p, q, pad_mask=None):
    p_loss = F.kl_div(F.log_softmax(p, dim=-1), F.softmax(q, dim=-1), reduction="none")
    q_loss = F.kl_div(F.log_softmax(q, dim=-1), F.softmax(p, dim=-1), reduction="none")
    if pad_mask is not None:
        p_loss.masked_fill_(pad_mask, 0.0)
        q_loss.masked_fill_(pad_mask, 0.0)
    # README uses .sum(); we average over the batch so alpha does not depend on batch size
    return (p_loss.sum() + q_loss.sum()) / (2 * p.shape[0])


class RDropTrainer(Trainer):
    def __init__(self, *args, rdrop_alpha=1.0, alpha_warmup_steps=10, **kwargs):
        super().__init__(*args, **kwargs)
        self.rdrop_alpha, self.alpha_warmup_steps = rdrop_alpha, alpha_warmup_steps
        self.last_kl = 0.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        if not model.training:
            outputs = model(**inputs)
            loss = F.cross_entropy(outputs.logits, labels)
            return (loss, outputs) if return_outputs else loss
        doubled = {k: torch.cat([v, v.clone()], dim=0) for k, v in inputs.items()}
        outputs = model(**doubled)
        logits1, logits2 = outputs.logits.chunk(2, dim=0)
        ce = 0.5 * (F.cross_entropy(logits1, labels) + F.cross_entropy(logits2, labels))
        kl = compute_kl_loss(logits1, logits2)
        alpha = self.rdrop_alpha * min(1.0, (self.state.global_step + 1) / self.alpha_warmup_steps)
        self.last_kl = kl.item()
        loss = ce + alpha * kl
        return (loss, outputs) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        if "loss" in logs:
            logs["rdrop_kl"] = round(self.last_kl, 5)
        super().log(logs, *args, **kwargs)


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main():
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, num_labels=2, pad_token_id=PAD)
    model = BertForSequenceClassification(config)
    train_ds, eval_ds = ListDataset(make_reviews(640, 1)), ListDataset(make_reviews(160, 2))
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir, per_device_train_batch_size=16, per_device_eval_batch_size=64, max_steps=60,
            learning_rate=3e-3, weight_decay=0.01, warmup_steps=4, lr_scheduler_type="linear",
            eval_strategy="steps", eval_steps=15, logging_steps=15, gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False}, remove_unused_columns=False,
            report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
        trainer = RDropTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                               data_collator=pad_collator, compute_metrics=compute_metrics, rdrop_alpha=1.0)
        trainer.train()
        metrics = trainer.evaluate()
    print(f"final eval loss {metrics['eval_loss']:.4f} accuracy {metrics['eval_accuracy']:.3f}")


if __name__ == "__main__":
    main()
