"""Fine-tuning a tiny BERT classifier with Hugging Face ``transformers.Trainer``, the way
its examples do it: model from a config, a ``Dataset`` of dicts, ``TrainingArguments``,
periodic evaluation. Runs as one process, with gradient accumulation (``--grad-accum``),
or as a 2-rank DDP job under ``torchrun`` (gloo on CPU).

Planted bugs (``--bug``), each live from iteration ``--onset``:

- ``eval_dropout``: the custom classification head calls ``F.dropout(x, p)`` without
  ``training=self.training`` (its default is ``True``), so dropout stays on in every
  evaluation; the first evaluation runs after iteration ``onset - 1``.
- ``frozen_updated`` (with ``--freeze-embeddings``, whose healthy run keeps the
  embeddings frozen with an optimizer the user built over all parameters): the
  embeddings are meant to stay frozen for the whole run, but an unfreezing
  callback meant for "epoch 3" compares against the global step, so from the onset the
  "frozen" embeddings receive gradients and the optimizer (built by the user over all
  parameters) updates them.
- ``rank_drift`` (torchrun only): a callback restores the "best" classifier head on the
  main process only (``is_world_process_zero``) without broadcasting it; DDP never
  re-synchronises parameters, so the replicas differ from the onset on.
"""

from __future__ import annotations

import os
import tempfile

from _common import TokenParity, parse_args, tiny_bert_config

import torch  # noqa: E402  (after _common: offline settings first)
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import (  # noqa: E402
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

BUGS = ("eval_dropout", "frozen_updated", "rank_drift")


class DropoutHead(nn.Module):
    """A pooled-output head with its own dropout, written with the functional API."""

    def __init__(self, hidden: int, labels: int, forget_training_flag: bool) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, labels)
        self.forget_training_flag = forget_training_flag

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        if self.forget_training_flag:
            pooled = F.dropout(pooled, p=0.3)  # the bug: training defaults to True
        else:
            pooled = F.dropout(pooled, p=0.3, training=self.training)
        return self.dense(pooled)


class UnfreezeEmbeddings(TrainerCallback):
    """Gradual unfreezing whose threshold is compared against the wrong counter."""

    def __init__(self, model: nn.Module, at_step: int) -> None:
        self.model, self.at_step = model, at_step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step >= self.at_step:  # meant: state.epoch >= 3
            self.model.bert.embeddings.requires_grad_(True)


class RestoreBestHeadOnMain(TrainerCallback):
    """Restores a saved head on the main process only: the other rank keeps its own."""

    def __init__(self, model: nn.Module, at_step: int) -> None:
        self.model, self.at_step = model, at_step
        self.best = {k: v.clone() + 0.05 for k, v in model.classifier.state_dict().items()}

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at_step and state.is_world_process_zero:
            self.model.classifier.load_state_dict(self.best)


def main() -> None:
    args = parse_args(__doc__, BUGS, flags=(("--freeze-embeddings", "freeze the embeddings; user-built AdamW"),))
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification(tiny_bert_config())
    model.classifier = DropoutHead(32, 2, forget_training_flag=args.bug == "eval_dropout")
    callbacks: list[TrainerCallback] = []
    optimizers = (None, None)
    if args.freeze_embeddings:
        model.bert.embeddings.requires_grad_(False)
        optimizers = (torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0), None)
    if args.bug == "frozen_updated":
        callbacks.append(UnfreezeEmbeddings(model, args.onset))
    if args.bug == "rank_drift":
        callbacks.append(RestoreBestHeadOnMain(model, args.onset))

    with tempfile.TemporaryDirectory() as scratch:
        training_args = TrainingArguments(
            output_dir=args.output_dir or scratch, use_cpu=True, seed=args.seed, data_seed=args.seed,
            per_device_train_batch_size=8, per_device_eval_batch_size=16,
            gradient_accumulation_steps=args.grad_accum, max_steps=args.steps, learning_rate=5e-3,
            eval_strategy="steps", eval_steps=args.onset, logging_steps=2, save_strategy="no",
            report_to="none", disable_tqdm=True, dataloader_num_workers=0,
            ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=TokenParity(512, args.seed),
                          eval_dataset=TokenParity(32, args.seed + 1), callbacks=callbacks, optimizers=optimizers)
        trainer.train()
        print(f"final eval {trainer.evaluate()}", flush=True)


if __name__ == "__main__":
    main()
