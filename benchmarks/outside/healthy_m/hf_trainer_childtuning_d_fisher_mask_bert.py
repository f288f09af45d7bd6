"""Child-Tuning_D fine-tuning of a small BERT classifier with the HF Trainer.

Modelled on: alibaba/AliceMind ``ChildTuning/`` (Xu et al., "Raise a Child in Large Language
Model: Towards Effective and Generalizable Fine-tuning", EMNLP 2021): ``ChildTuningOptimizer.py``
(``ChildTuningAdamW``: the gradient is multiplied in place by a mask inside ``step()``; in
"ChildTuning-D" the mask is fixed and comes from the Fisher information, in "ChildTuning-F" it
is a fresh Bernoulli(reserve_p) mask divided by reserve_p) and ``run_glue.py`` (``calculate_fisher``
runs forward/backward over the training set before training, without optimizer steps, sums
``grad ** 2`` of the parameters whose name contains "layer", and keeps the top ``reserve_p``
fraction), with the optimizer handed to ``Trainer(optimizers=(optimizer, scheduler))``.

Task: a ``BertForSequenceClassification`` built from a small ``BertConfig`` (no download) on
synthetic token sequences: 2-4 cue tokens from a "positive" or a "negative" set decide the label.

Unusual but correct: before training there are 12 backward passes whose gradients are only read
(Fisher estimate) and then zeroed; during training the optimizer zeroes about 70% of every encoder
matrix's gradient entries in place, so those weights never change (weight decay is 0), while the
embeddings, pooler and classifier are updated densely.
"""
import math
import tempfile

import numpy as np
import torch
from torch.distributions.bernoulli import Bernoulli
from torch.optim import Optimizer

torch.set_num_threads(1)

from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainingArguments,
                          get_linear_schedule_with_warmup, set_seed)

VOCAB, SEQ_LEN, PAD_ID, CLS_ID = 64, 16, 0, 1
POS_TOKENS, NEG_TOKENS = range(10, 14), range(14, 18)


class ChildTuningAdamW(Optimizer):
    """AdamW (decoupled weight decay, bias correction) whose gradient is masked before the update."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 reserve_p=1.0, mode=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.gradient_mask = None
        self.reserve_p = reserve_p
        self.mode = mode

    def set_gradient_mask(self, gradient_mask):
        self.gradient_mask = gradient_mask

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if self.mode == "ChildTuning-D":
                    if p in self.gradient_mask:
                        grad *= self.gradient_mask[p]
                elif self.mode == "ChildTuning-F":
                    grad_mask = Bernoulli(grad.new_full(size=grad.size(), fill_value=self.reserve_p))
                    grad *= grad_mask.sample() / self.reserve_p
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                beta1, beta2 = group["betas"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                step_size = group["lr"] * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                p.addcdiv_(exp_avg, denom, value=-step_size)
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss


def calculate_fisher(model, data_loader, reserve_p, max_grad_norm=1.0):
    """Sum of squared gradients over the data for encoder params; keep the top reserve_p fraction."""
    gradient_mask = {p: p.new_zeros(p.size()) for n, p in model.named_parameters() if "layer" in n}
    model.train()
    n_batches = len(data_loader)
    for batch in data_loader:
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        for p in gradient_mask:
            gradient_mask[p] += (p.grad ** 2) / n_batches
        model.zero_grad()
    r = torch.cat([m.view(-1) for m in gradient_mask.values()]).cpu().numpy()
    polar = np.percentile(r, (1 - reserve_p) * 100)
    for p in gradient_mask:
        gradient_mask[p] = (gradient_mask[p] >= polar).float()
    kept = sum(m.sum().item() for m in gradient_mask.values()) / r.size
    print(f"Fisher mask: polar={polar:.3e}, kept {kept:.1%} of {r.size} encoder weights")
    return gradient_mask


def make_split(n, seed):
    g = np.random.default_rng(seed)
    rows, labels = [], []
    for _ in range(n):
        length = int(g.integers(10, SEQ_LEN + 1))
        toks = g.integers(18, VOCAB, size=length)
        label = int(g.integers(0, 2))
        n_cue = int(g.integers(2, 5))
        n_pos, n_neg = (n_cue, 0) if label == 1 else (0, n_cue)
        slots = g.choice(np.arange(1, length), size=n_pos + n_neg, replace=False)
        toks[slots[:n_pos]] = g.choice(list(POS_TOKENS), size=n_pos)
        toks[slots[n_pos:]] = g.choice(list(NEG_TOKENS), size=n_neg)
        toks[0] = CLS_ID
        ids = np.full(SEQ_LEN, PAD_ID)
        ids[:length] = toks
        rows.append(ids)
        labels.append(label)
    ids = torch.tensor(np.stack(rows))
    return [{"input_ids": ids[i], "attention_mask": (ids[i] != PAD_ID).long(),
             "labels": torch.tensor(labels[i])} for i in range(n)]


def compute_metrics(p):
    preds = np.argmax(p.predictions, axis=1)
    return {"accuracy": float((preds == p.label_ids).mean())}


def main():
    set_seed(42)
    train_ds, eval_ds = make_split(768, seed=1), make_split(256, seed=2)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=SEQ_LEN, num_labels=2,
                        pad_token_id=PAD_ID)
    model = BertForSequenceClassification(config)

    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir, per_device_train_batch_size=32, per_device_eval_batch_size=128,
            num_train_epochs=3, learning_rate=1e-3, warmup_ratio=0.1, max_grad_norm=1.0,
            eval_strategy="epoch", logging_steps=8, report_to=[], save_strategy="no",
            use_cpu=True, disable_tqdm=True, seed=42)

        # Child-Tuning_D: Fisher information from (part of) the training data, before any update
        fisher_loader = torch.utils.data.DataLoader(train_ds[:384], batch_size=32)
        gradient_mask = calculate_fisher(model, fisher_loader, reserve_p=0.3)

        no_decay = ["bias", "LayerNorm.weight"]
        grouped = [
            {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
             "weight_decay": args.weight_decay},
            {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
             "weight_decay": 0.0},
        ]
        optimizer = ChildTuningAdamW(grouped, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                                     reserve_p=0.3, mode="ChildTuning-D")
        optimizer.set_gradient_mask(gradient_mask)
        num_steps = math.ceil(len(train_ds) / args.per_device_train_batch_size) * int(args.num_train_epochs)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * num_steps), num_steps)
        trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          compute_metrics=compute_metrics, optimizers=(optimizer, scheduler))

        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        trainer.train()
        metrics = trainer.evaluate()

    changed_outside, kept, changed_inside = 0, 0, 0
    for n, p in model.named_parameters():
        if p in gradient_mask:
            changed = p.detach() != before[n]
            mask = gradient_mask[p].bool()
            changed_outside += (changed & ~mask).sum().item()
            kept += mask.sum().item()
            changed_inside += (changed & mask).sum().item()
    print(f"encoder entries in the mask: {kept}, of which changed: {changed_inside}; "
          f"changed outside the mask: {changed_outside}")
    print({k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})


if __name__ == "__main__":
    main()
