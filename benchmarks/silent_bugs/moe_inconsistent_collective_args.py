"""MoE collective arguments inconsistent across workers (DeepSpeed issue 5794: ranks
disagreed on the arguments of the MoE ``all_to_all``/capacity collectives).

Two gloo ranks run an expert-parallel MoE layer: a replicated router, one expert per
rank, token dispatch with ``all_to_all_single`` at a fixed capacity. The router's
gradients are all-reduced (``ReduceOp.SUM``) so the router stays replicated. From the
onset rank 1 reads the reduction op from a stale config and passes ``ReduceOp.MAX``:
the call succeeds with mismatched arguments and gloo silently reduces some chunks with
one op and some with the other, so the router trains on gradients that are neither the
sum nor the maximum. The only trace of it is the argument mismatch itself.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 moe_inconsistent_collective_args.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from _common import bug_active, init_gloo, parse_args, shutdown_gloo, shard_generator

WIDTH, CAPACITY = 8, 4


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous())
        return out


class ExpertParallelMoE(nn.Module):
    def __init__(self, world: int) -> None:
        super().__init__()
        self.world = world
        self.router = nn.Linear(WIDTH, world)
        self.expert = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        gates = torch.softmax(self.router(tokens), dim=-1)
        choice = gates.argmax(dim=-1)
        dispatch = torch.zeros(self.world, CAPACITY, WIDTH)
        slots = torch.zeros(self.world, CAPACITY, dtype=torch.long) - 1
        for expert in range(self.world):
            chosen = (choice == expert).nonzero().flatten()[:CAPACITY]
            dispatch[expert, : len(chosen)] = tokens[chosen] * gates[chosen, expert : expert + 1]
            slots[expert, : len(chosen)] = chosen
        received = _AllToAll.apply(dispatch.reshape(self.world * CAPACITY, WIDTH))
        processed = self.expert(received)
        returned = _AllToAll.apply(processed).reshape(self.world, CAPACITY, WIDTH)
        output = torch.zeros_like(tokens)
        for expert in range(self.world):
            valid = slots[expert] >= 0
            output = output.index_add(0, slots[expert][valid], returned[expert][valid])
        return output


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    torch.manual_seed(args.seed)  # identical router replicas; experts differ by rank
    layer = ExpertParallelMoE(world)
    with torch.no_grad():
        expert_rng = torch.Generator().manual_seed(args.seed * 10 + rank)
        for param in layer.expert.parameters():
            param.copy_(torch.randn(param.shape, generator=expert_rng) * 0.3)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.05)
    data = shard_generator(args.seed, rank)

    layer.train()
    for step in range(args.steps):
        tokens = torch.randn(6, WIDTH, generator=data)
        optimizer.zero_grad()
        loss = F.mse_loss(layer(tokens), tokens.roll(1, dims=1))
        loss.backward()
        op = dist.ReduceOp.MAX if (bug_active(args, step) and rank == 1) else dist.ReduceOp.SUM
        for param in layer.router.parameters():
            dist.all_reduce(param.grad, op=op)
            param.grad.div_(world)
        optimizer.step()
        router = layer.router.weight.detach().clone()
        gathered = [torch.empty_like(router) for _ in range(world)]
        dist.all_gather(gathered, router)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} router_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
