"""Autocast silently skipped for some ops (Lightning-Thunder issue 725: operations that
were not registered as torch symbols lost their autocast transformation, so ``relu``
and friends ran in full precision under ``autocast``).

Training runs under ``torch.autocast("cpu", dtype=torch.bfloat16)``. From the onset the
MLP block switches its projection to a "fused" kernel — a custom autograd function
declared with ``custom_fwd(cast_inputs=torch.float32)`` — so inside the autocast region
that projection runs in fp32, and the block's ``ReLU`` returns fp32 where every other
activation returns bf16 (the case's catching symptom: ``relu`` output dtype under
autocast).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class _FusedLinear(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight, bias)
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            weight = weight.detach().requires_grad_()
            bias = bias.detach().requires_grad_()
            out = F.linear(x, weight, bias)
        return torch.autograd.grad(out, (x, weight, bias), grad)


class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = _FusedLinear.apply(x, self.fc.weight, self.fc.bias) if self.fused else self.fc(x)
        return self.act(projected)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.block = MLPBlock(32)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.inp(x)))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    centres = torch.randn(4, 16, generator=generator)

    model.train()
    for step in range(args.steps):
        model.block.fused = bug_active(args, step)
        labels = torch.randint(0, 4, (32,), generator=generator)
        x = centres[labels] + 0.5 * torch.randn(32, 16, generator=generator)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.block(model.inp(x))
            logits = model.out(hidden)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} block_dtype {hidden.dtype}", flush=True)


if __name__ == "__main__":
    main()
