"""Schedule-Free AdamW with accelerate: no LR schedule, and train()/eval() swap the weights.

Modelled on: huggingface/accelerate ``examples/by_feature/schedule_free.py`` (BERT sequence
classification; ``model.train(); optimizer.train()`` before the training loop of each epoch and
``model.eval(); optimizer.eval()`` before evaluation), with the optimizer written out following
facebookresearch/schedule_free ``schedulefree/adamw_schedulefree_reference.py`` (Defazio et al.,
"The Road Less Scheduled", NeurIPS 2024) because the ``schedulefree`` package is not installed.
The BERT is built from a config and the MRPC data is replaced by a synthetic sentiment task.

What is unusual about the loop (deliberate):
  * There is no LR scheduler: the optimizer keeps three sequences (z: SGD-like iterate, x: its
    running average, y: the interpolation where gradients are taken).  ``optimizer.eval()``
    overwrites the parameters with x and ``optimizer.train()`` writes y back -- the model's
    weights change at eval time without any gradient step, and change back afterwards.
  * The optimizer is put in eval mode before ``accelerator.save_state`` (as the schedule-free
    README requires), the best checkpoint is kept, and it is restored at the end with
    ``accelerator.load_state``.
  * Warm-up lives inside the optimizer (``warmup_steps``); the averaging weight uses lr_max**2.
  * bf16 autocast on CPU via ``Accelerator(mixed_precision="bf16")`` and gradient accumulation
    through ``accelerator.accumulate``.
"""
import math
import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification, set_seed

torch.set_num_threads(1)


class AdamWScheduleFreeReference(torch.optim.Optimizer):
    def __init__(self, params, lr=0.0025, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, warmup_steps=0,
                 r=0.0, weight_lr_power=2.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, r=r, k=0, warmup_steps=warmup_steps, train_mode=True,
                        weight_sum=0.0, lr_max=-1.0, weight_lr_power=weight_lr_power, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def eval(self):
        for group in self.param_groups:
            if group["train_mode"]:
                for p in group["params"]:
                    if "x" in self.state[p]:
                        p.copy_(self.state[p]["x"])
                group["train_mode"] = False

    @torch.no_grad()
    def train(self):
        for group in self.param_groups:
            if not group["train_mode"]:
                for p in group["params"]:
                    if "y" in self.state[p]:
                        p.copy_(self.state[p]["y"])
                group["train_mode"] = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if not group["train_mode"]:
                raise RuntimeError("optimizer.step() called while the optimizer is in eval mode")
            beta1, beta2 = group["betas"]
            k, warmup = group["k"], group["warmup_steps"]
            sched = (k + 1) / warmup if k < warmup else 1.0
            bias_correction2 = 1 - beta2 ** (k + 1)
            lr = group["lr"] * sched * math.sqrt(bias_correction2)
            lr_max = group["lr_max"] = max(lr, group["lr_max"])
            weight = ((k + 1) ** group["r"]) * (lr_max ** group["weight_lr_power"])
            weight_sum = group["weight_sum"] = group["weight_sum"] + weight
            ckp1 = weight / weight_sum if weight_sum != 0 else 0.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "z" not in state:
                    state["z"], state["x"], state["y"] = p.clone(), p.clone(), p.clone()
                    state["exp_avg_sq"] = torch.zeros_like(p)
                z, x, y, exp_avg_sq = state["z"], state["x"], state["y"], state["exp_avg_sq"]
                if group["weight_decay"] != 0:
                    z.sub_(y, alpha=lr * group["weight_decay"])
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                z.addcdiv_(p.grad, exp_avg_sq.sqrt().add_(group["eps"]), value=-lr)
                x.mul_(1 - ckp1).add_(z, alpha=ckp1)
                y.copy_(x.mul(beta1).add_(z, alpha=1 - beta1))
                p.copy_(y)
            group["k"] = k + 1
        return loss


POSITIVE, NEGATIVE = range(5, 15), range(15, 25)
PAD, CLS, VOCAB = 0, 1, 64


class SentimentDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        while len(self.items) < n:
            length = int(torch.randint(8, 17, (1,), generator=g))
            ids = torch.randint(5, VOCAB, (length,), generator=g)
            score = sum(int(t) in POSITIVE for t in ids) - sum(int(t) in NEGATIVE for t in ids)
            if score != 0:
                self.items.append((torch.cat([torch.tensor([CLS]), ids]), int(score > 0)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate_fn(batch):
    L = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), L), PAD)
    attention_mask = torch.zeros((len(batch), L), dtype=torch.long)
    for i, (ids, _) in enumerate(batch):
        input_ids[i, :len(ids)], attention_mask[i, :len(ids)] = ids, 1
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": torch.tensor([y for _, y in batch])}


def training_function(config):
    accelerator = Accelerator(cpu=True, mixed_precision="bf16",
                              gradient_accumulation_steps=config["gradient_accumulation_steps"])
    set_seed(config["seed"])
    train_dataloader = DataLoader(SentimentDataset(640, 0), shuffle=True, batch_size=config["batch_size"],
                                  collate_fn=collate_fn, drop_last=True)
    eval_dataloader = DataLoader(SentimentDataset(256, 1), batch_size=64, collate_fn=collate_fn)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=32, num_labels=2, pad_token_id=PAD))
    optimizer = AdamWScheduleFreeReference(model.parameters(), lr=config["lr"], warmup_steps=10,
                                           weight_decay=0.01)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)

    ckpt_dir = os.path.join(config["tmp"], "best")
    best_acc, best_epoch, n_steps = -1.0, -1, 0
    for epoch in range(config["num_epochs"]):
        model.train()
        optimizer.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                n_steps += 1
                if n_steps % 10 == 0:
                    accelerator.print(f"epoch {epoch} opt-step {n_steps} loss {outputs.loss.item():.4f}")

        model.eval()
        optimizer.eval()  # parameters <- x (the averaged iterate)
        correct = total = 0
        for batch in eval_dataloader:
            with torch.no_grad():
                logits = model(**batch).logits
            preds, refs = accelerator.gather_for_metrics((logits.argmax(dim=-1), batch["labels"]))
            correct += (preds == refs).sum().item()
            total += refs.numel()
        acc = correct / total
        accelerator.print(f"epoch {epoch}: accuracy {acc:.4f}")
        if acc > best_acc:
            best_acc, best_epoch = acc, epoch
            accelerator.save_state(ckpt_dir)  # saved in eval mode, as schedule-free requires

    accelerator.load_state(ckpt_dir)
    model.eval()
    with torch.no_grad():
        correct = sum((model(**b).logits.argmax(-1) == b["labels"]).sum().item() for b in eval_dataloader)
    accelerator.print(f"restored best checkpoint from epoch {best_epoch}: accuracy {correct / total:.4f} "
                      f"(recorded {best_acc:.4f}); total optimizer steps {n_steps}")
    accelerator.end_training()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16,
                  "gradient_accumulation_steps": 2, "tmp": tmp}
        training_function(config)


if __name__ == "__main__":
    main()
