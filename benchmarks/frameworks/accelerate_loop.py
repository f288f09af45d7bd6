"""A plain Hugging Face ``accelerate`` training loop over a tiny GPT-2 built from a
config, as the accelerate examples write it: ``Accelerator()``, ``prepare``,
``accelerator.backward``, a linear schedule (with ``--warmup``, two iterations of warm-up from a
learning rate of 0; none by default, as in the accelerate examples), evaluation every
``--onset`` iterations.

Planted bug (``--bug eval_dropout``): the evaluation loop forgets ``model.eval()`` (and
the ``model.train()`` after it), so every evaluation from the first one — after
iteration ``onset - 1`` — runs with dropout active.
"""

from __future__ import annotations

from _common import NextToken, parse_args, tiny_gpt2_config

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import GPT2LMHeadModel, get_linear_schedule_with_warmup  # noqa: E402

BUGS = ("eval_dropout",)


def evaluate(accelerator: Accelerator, model, loader, switch_modes: bool) -> float:
    if switch_modes:
        model.eval()
    losses = []
    with torch.no_grad():
        for batch in loader:
            losses.append(accelerator.gather_for_metrics(model(**batch).loss.reshape(1)))
    if switch_modes:
        model.train()
    return torch.cat(losses).mean().item()


def main() -> None:
    args = parse_args(__doc__, BUGS, flags=(("--warmup", "two warm-up iterations, the first at learning rate 0"),))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    set_seed(args.seed)
    model = GPT2LMHeadModel(tiny_gpt2_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2 if args.warmup else 0, num_training_steps=args.steps)
    train = DataLoader(NextToken(256, args.seed), batch_size=8, shuffle=True,
                       generator=torch.Generator().manual_seed(args.seed))
    val = DataLoader(NextToken(32, args.seed + 1), batch_size=16)
    model, optimizer, train, val, scheduler = accelerator.prepare(model, optimizer, train, val, scheduler)

    model.train()
    step = 0
    batches = iter(train)
    while step < args.steps:
        with accelerator.accumulate(model):
            loss = model(**next(batches)).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        step += 1
        if step % args.onset == 0:
            val_loss = evaluate(accelerator, model, val, switch_modes=args.bug != "eval_dropout")
            accelerator.print(f"step {step} loss {loss.item():.4f} val_loss {val_loss:.4f}")


if __name__ == "__main__":
    main()
