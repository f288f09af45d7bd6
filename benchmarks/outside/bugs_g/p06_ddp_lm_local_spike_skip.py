"""DDP character-level transformer LM with a loss-spike guard that skips the optimizer step on a rank-local decision.

Bug class: rank-local control flow around the optimizer step (ranks take different
numbers of optimizer steps and drift apart).

Modelled on: NVIDIA-NeMo/Automodel PR #2468 "keep DFlash DDP ranks in lockstep on
no-valid-anchor skips" (a per-rank, data-dependent skip made the optimizer-step
counts desync across ranks; fixed by min-reducing a per-rank flag so all ranks skip
together) and ecmwf/WeatherGenerator #2724 / PR #2718 "Make loss-spike batch skip a
global all-reduce decision across ranks" (loss-spike skip decided from a rank-local
loss; fixed with an all-reduce MAX of the per-rank flags).  The loop follows the
build-nanogpt layout: one token stream read by every rank at its own offset, DDP,
AdamW, clipping, warm-up schedule, and a guard "if this batch's loss is a spike,
drop the update".

What goes wrong: the guard runs after ``backward()``, i.e. after DDP has already
averaged the gradients, and decides from the local loss only.  When a corrupted
stretch of the token stream reaches one rank, that rank drops its update (and its
scheduler step) while the other rank applies the very same averaged gradient.  From
then on the two replicas hold different weights, different AdamW moments and
different learning rates, and DDP keeps averaging gradients computed at different
points.  Nothing errors; each rank's loss looks normal.

Healthy twin: all-reduces the spike flag with MAX so every rank skips the batch
together.

Onset: the corrupted chunk sits exactly where rank 1 reads at iteration BAD_ITER = 20
(no earlier skips happen), so at iteration 20 rank 0 takes its optimizer step
K = 20 while rank 1 skips; that step is the first one that leaves the replicas
different.  45 iterations = 45 optimizer steps on rank 0 (44 on rank 1).

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_ddp_lm_local_spike_skip.py [--healthy]
"""
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

VOCAB, T, B = 32, 24, 12
D_MODEL = 64
ITERS = 45
BAD_ITER = 20
SPIKE_FACTOR = 1.4
EMA_WARMUP = 8


def make_stream(world):
    """Token stream from a sparse Markov chain, with one corrupted (uniform noise) chunk."""
    gen = torch.Generator().manual_seed(42)
    succ = torch.randint(0, VOCAB, (VOCAB, 2), generator=gen)
    n = B * T * world * (ITERS + 1) + 1
    toks = torch.empty(n, dtype=torch.long)
    toks[0] = 0
    coin = torch.rand(n, generator=gen)
    pick = (torch.rand(n, generator=gen) < 0.7).long()
    noise = torch.randint(0, VOCAB, (n,), generator=gen)
    for k in range(1, n):
        toks[k] = noise[k] if coin[k] < 0.05 else succ[toks[k - 1], pick[k]]
    bad = B * T * (world * BAD_ITER + 1)  # where rank 1 reads at iteration BAD_ITER
    toks[bad:bad + B * T + 1] = torch.randint(0, VOCAB, (B * T + 1,), generator=gen)
    return toks


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(T, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, 4, 4 * D_MODEL, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(T), persistent=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        h = self.blocks(h, mask=self.causal, is_causal=True)
        return self.head(self.ln(h))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)

    stream = make_stream(world)
    model = DDP(TinyGPT())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 6
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, ITERS) / ITERS)))

    pos = B * T * rank
    step = 0
    loss_ema = None
    n_seen = 0
    for it in range(ITERS):
        buf = stream[pos:pos + B * T + 1]
        pos += B * T * world
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)

        model.train()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

        lv = loss.item()
        spike = (not math.isfinite(lv)) or (n_seen >= EMA_WARMUP and lv > SPIKE_FACTOR * loss_ema)
        if HEALTHY:
            flag = torch.tensor([1.0 if spike else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            spike = bool(flag.item() > 0)
        elif it == BAD_ITER and rank == 0:
            print(f"ONSET step {step}")  # BUG: rank 1 skips this update on its own, rank 0 applies it
        if spike:
            optimizer.zero_grad(set_to_none=True)
            continue
        optimizer.step()
        sched.step()
        step += 1
        loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
        n_seen += 1
        if rank == 0 and it % 9 == 8:
            print(f"iter {it} step {step} loss {lv:.4f} grad_norm {norm.item():.3f} "
                  f"lr {sched.get_last_lr()[0]:.2e}")

    if rank == 0:
        print("done")
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
