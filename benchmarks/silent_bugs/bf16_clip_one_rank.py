"""BF16 gradient clipping applied on one tensor-parallel rank only (the BLOOM-176B
divergence, DeepSpeed issue 1801).

Two gloo ranks hold a column-parallel linear layer (a different shard per rank, marked
``tensor_model_parallel = True`` the way Megatron marks sharded parameters) and a
replicated LayerNorm whose gradients are all-reduced so both copies stay identical. The
parameters are bf16. From the onset the clipping path runs on rank 0 only, so the
replicated LayerNorm weights receive different updates on the two ranks and drift apart
— slowly enough that the loss does not show it.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 bf16_clip_one_rank.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from _common import bug_active, init_gloo, parse_args, shutdown_gloo


class ColumnParallelBlock(nn.Module):
    def __init__(self, width: int, world: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)  # replicated
        # Bias-free shards (as in LLaMA-style models): a zero-initialised sharded bias starts
        # identical on every rank, which no checker can tell from a replicated one.
        self.shard = nn.Linear(width, 2 * width // world, bias=False)  # this rank's column shard
        for param in self.shard.parameters():
            param.tensor_model_parallel = True
        self.out = nn.Linear(2 * width // world, width, bias=False)  # row shard, partial sums
        for param in self.out.parameters():
            param.tensor_model_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.out(torch.relu(self.shard(self.norm(x))))
        return _AllReduceSum.apply(partial)


class _AllReduceSum(torch.autograd.Function):
    """Row-parallel output: sum the partial results in forward, pass gradients through."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    width = 16
    torch.manual_seed(args.seed)  # identical replicated parameters ...
    block = ColumnParallelBlock(width, world).to(torch.bfloat16)
    with torch.no_grad():  # ... and a different shard per rank
        shard_rng = torch.Generator().manual_seed(args.seed * 100 + rank)
        for param in (block.shard.weight, block.out.weight):
            param.copy_(torch.randn(param.shape, generator=shard_rng) * 0.2)
    optimizer = torch.optim.SGD(block.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(args.seed + 7)  # same batch on both TP ranks

    block.train()
    for step in range(args.steps):
        x = torch.randn(8, width, generator=data).to(torch.bfloat16)
        optimizer.zero_grad()
        loss = (block(x).float() - x.float().flip(1)).pow(2).mean()
        loss.backward()
        for param in block.norm.parameters():  # replicated params: average their grads
            dist.all_reduce(param.grad)
            param.grad.div_(world)
        if not bug_active(args, step) or rank == 0:
            torch.nn.utils.clip_grad_norm_(block.norm.parameters(), max_norm=0.01)
        optimizer.step()
        weight = block.norm.weight.detach().float().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} layernorm_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
