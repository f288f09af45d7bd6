"""Checkpoint keys carry DDP's ``module.`` prefix and are silently ignored (StackOverflow
question 61854165: the loaded state dict is merged into the model's own, "the loaded state is
ignored ... you are left with the randomly initialised model").

Root-cause class: checkpoint silently not loaded. The job trains, saves a checkpoint in
the format a ``DistributedDataParallel``-wrapped model writes (every key prefixed with
``module.``), and at the onset resumes into a freshly built model. The healthy program
strips the prefix and loads strictly; the buggy one merges the checkpoint into
``model.state_dict()`` first, so ``load_state_dict`` sees its own random weights and no
error. Training continues from scratch with nothing said.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))


def resume(checkpoint: dict[str, torch.Tensor], merge: bool) -> nn.Module:
    model = build()
    if merge:
        state = model.state_dict()
        state.update(checkpoint)  # "module.0.weight" etc. are extra keys; none replaces a weight
        model.load_state_dict({k: v for k, v in state.items() if k in model.state_dict()})
    else:
        model.load_state_dict({k.removeprefix("module."): v for k, v in checkpoint.items()})
    return model


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    weights = torch.randn(10, 1, generator=generator)

    for step in range(args.steps):
        if step == args.onset:  # the job is pre-empted and resumed from its checkpoint
            checkpoint = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
            model = resume(checkpoint, merge=args.bug)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
