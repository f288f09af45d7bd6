"""DDP (gloo, 2 CPU ranks) with a PowerSGD communication hook, ZeroRedundancyOptimizer and
gradient accumulation via no_sync(), plus a consolidated checkpoint written by rank 0.

Modelled on: pytorch/tutorials recipes_source/zero_redundancy_optimizer.rst ("Shard Optimizer
States with ZeroRedundancyOptimizer") and the PyTorch "DDP Communication Hooks" documentation
(https://pytorch.org/docs/stable/ddp_comm_hooks.html, PowerSGDState / powerSGD_hook).

Unusual but intended:
  * optimizer state is rank-local by design: each rank's ZeroRedundancyOptimizer holds Adam
    moments only for its own shard of the parameters and broadcasts updated shards after
    step(); before saving, consolidate_state_dict(to=0) gathers everything on rank 0;
  * the PowerSGD hook edits gradients during all-reduce: for the first `start_powerSGD_iter`
    iterations it does a plain all-reduce, then switches to rank-1 low-rank compression with
    error feedback, whose residual buffers are kept per rank;
  * gradients are accumulated over 2 micro-batches with DDP.no_sync() on the first one, so no
    communication happens on that backward.
"""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)


class ResMLP(nn.Module):
    def __init__(self, d=128, depth=3):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(depth))
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h).squeeze(-1)


def target_fn(x):
    return torch.sin(x[:, :4].sum(1)) + 0.5 * x[:, 4:8].pow(2).mean(1) - x[:, 8:].prod(1).tanh()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ResMLP())

    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=10, min_compression_rate=0.5)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)

    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40, eta_min=1e-4)

    gen = torch.Generator().manual_seed(1000 + rank)  # each rank draws its own shard of the stream
    x_val = torch.randn(512, 16, generator=torch.Generator().manual_seed(7))
    y_val = target_fn(x_val)

    accum, micro_bs = 2, 64
    for step in range(40):
        model.train()
        for micro in range(accum):
            x = torch.randn(micro_bs, 16, generator=gen)
            y = target_fn(x)
            if micro < accum - 1:
                with model.no_sync():
                    (F.mse_loss(model(x), y) / accum).backward()
            else:
                loss = F.mse_loss(model(x), y) / accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if step % 10 == 0 and rank == 0:
            print(f"step {step:2d} loss {accum * loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}", flush=True)

    n_local = sum(1 for s in opt.optim.state.values() if s)
    print(f"[rank {rank}] local Adam states: {n_local} of {len(list(model.parameters()))} params", flush=True)

    model.eval()
    with torch.no_grad():
        val = F.mse_loss(model(x_val), y_val).item()
    if rank == 0:
        print(f"val mse {val:.4f}", flush=True)

    opt.consolidate_state_dict(to=0)
    ckpt_dir = tempfile.mkdtemp() if rank == 0 else None
    if rank == 0:
        path = os.path.join(ckpt_dir, "ckpt.pt")
        torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": 40}, path)
        ck = torch.load(path)
        print(f"saved consolidated optimizer with {len(ck['optim']['state'])} param states", flush=True)
        shutil.rmtree(ckpt_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
