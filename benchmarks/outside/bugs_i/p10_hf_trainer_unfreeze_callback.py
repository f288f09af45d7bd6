"""Review-sentiment classifier with HF Trainer: head-only warm-up, then unfreezing the encoder.

Modelled on: deepspeedai/DeepSpeed#1767 "[BUG]" -- "I want to freeze part of my model in the
first few epochs and unfreeze it.  But it doesn't seem to work.  The model doesn't seem to learn
after unfreezing it".  The optimizer was built once, at the start, from the parameters that
required grad at that moment; flipping ``requires_grad`` back to True later makes autograd
compute gradients for the encoder, but no optimizer ever steps them.  HF ``Trainer`` behaves the
same way: ``Trainer.create_optimizer`` only collects ``p.requires_grad`` parameters.  The fix
(what fastai's ``unfreeze`` / Lightning's ``BackboneFinetuning`` do) is to hand the unfrozen
parameters to the optimizer (``add_param_group``) when unfreezing.

What is unusual about the loop: a ``TrainerCallback`` unfreezes the BERT encoder at the start of
epoch ``--unfreeze-epoch``; the callback gets the live optimizer from the Trainer's callback
kwargs.  ``--healthy`` adds the encoder parameters to that optimizer (the fix).
"""
import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()

VOCAB, SEQ = 120, 24
POS_WORDS, NEG_WORDS = list(range(10, 20)), list(range(20, 30))


class ReviewDataset(Dataset):
    """Token sequences; positive reviews mostly contain positive words and vice versa."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(30, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        for i in range(n):
            major = POS_WORDS if self.labels[i] == 1 else NEG_WORDS
            minor = NEG_WORDS if self.labels[i] == 1 else POS_WORDS
            k_major, k_minor = int(torch.randint(2, 5, (1,), generator=g)), int(torch.randint(0, 2, (1,), generator=g))
            slots = torch.randperm(SEQ - 1, generator=g)[: k_major + k_minor] + 1
            words = [major[int(j)] for j in torch.randint(0, 10, (k_major,), generator=g)]
            words += [minor[int(j)] for j in torch.randint(0, 10, (k_minor,), generator=g)]
            self.ids[i, slots] = torch.tensor(words, dtype=torch.long)
        self.ids[:, 0] = 1  # [CLS]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


class GradualUnfreezeCallback(TrainerCallback):
    def __init__(self, encoder, unfreeze_epoch, fix):
        self.encoder, self.unfreeze_epoch, self.fix = encoder, unfreeze_epoch, fix
        self.snapshot = None

    def on_epoch_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if int(round(state.epoch or 0)) != self.unfreeze_epoch or self.snapshot is not None:
            return
        params = list(self.encoder.parameters())
        for p in params:
            p.requires_grad_(True)
        if self.fix:
            lr = args.learning_rate
            optimizer.add_param_group({"params": params, "lr": lr, "weight_decay": args.weight_decay})
            sched = getattr(lr_scheduler, "scheduler", lr_scheduler)  # LambdaLR: one lambda per group
            sched.base_lrs.append(lr)
            sched.lr_lambdas.append(sched.lr_lambdas[0])
            sched._last_lr.append(lr)
        else:
            print(f"ONSET step {state.global_step}")
        self.snapshot = [p.detach().clone() for p in params]
        print(f"[callback] epoch {self.unfreeze_epoch}: unfroze {sum(p.numel() for p in params)} "
              f"encoder parameters at global_step {state.global_step}")

    def drift(self):
        return torch.sqrt(sum(((p.detach() - s) ** 2).sum()
                              for p, s in zip(self.encoder.parameters(), self.snapshot))).item()


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--epochs", type=int, default=7)
    p.add_argument("--unfreeze-epoch", type=int, default=1)
    args = p.parse_args()

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=SEQ, num_labels=2)
    model = BertForSequenceClassification(config)
    for p_ in model.bert.parameters():  # head-only warm-up ("linear probe")
        p_.requires_grad_(False)
    callback = GradualUnfreezeCallback(model.bert, args.unfreeze_epoch, args.healthy)

    with tempfile.TemporaryDirectory() as out_dir:
        targs = TrainingArguments(
            output_dir=out_dir, num_train_epochs=args.epochs, per_device_train_batch_size=16,
            per_device_eval_batch_size=64, learning_rate=1e-3, weight_decay=0.01,
            lr_scheduler_type="constant", eval_strategy="epoch", logging_steps=10,
            save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=targs, train_dataset=ReviewDataset(160, 0),
                          eval_dataset=ReviewDataset(128, 1), compute_metrics=compute_metrics,
                          callbacks=[callback])
        trainer.train()
        metrics = trainer.evaluate()

    n_opt = sum(p_.numel() for g in trainer.optimizer.param_groups for p_ in g["params"])
    print(f"EVIDENCE encoder weight change since unfreeze {callback.drift():.6f}; parameters in "
          f"optimizer {n_opt} of {sum(p_.numel() for p_ in model.parameters())}; "
          f"eval_accuracy {metrics['eval_accuracy']:.3f}")


if __name__ == "__main__":
    main()
