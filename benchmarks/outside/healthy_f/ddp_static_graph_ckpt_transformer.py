"""Small Transformer encoder trained with DDP(static_graph=True) and activation
checkpointing per block (use_reentrant=False).

Modelled on the DDP + activation checkpointing pattern discussed in pytorch/pytorch issue
"DDP doesn't work with gradient checkpointing" (the answers: pass static_graph=True, or use
the non-reentrant checkpoint) and the DistributedDataParallel docs for static_graph, with a warmup-then-cosine LambdaLR schedule as in many BERT-style recipes. Launch:

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_static_graph_ckpt_transformer.py

Unusual loop: each block's activations are dropped in forward and recomputed during
backward; DDP is told the graph is static so it can record the used parameters on the
first iteration and reuse that plan afterwards; the classifier reads a learned CLS token
and learned positional parameters that are used outside any submodule.
"""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, SEQ, DIM = 40, 24, 64


def make_data(n, seed):
    """Label = whether token 7 occurs more often than token 9 in the sequence."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    y = ((x == 7).sum(1) > (x == 9).sum(1)).long()
    return TensorDataset(x, y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    def __init__(self, n_layers=3):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(1, SEQ + 1, DIM))
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, 2)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, ids):
        x = torch.cat([self.cls.expand(ids.size(0), -1, -1), self.tok(ids)], 1) + self.pos
        for blk in self.blocks:
            if self.training:
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.ln(x[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true", help="ignored")
    ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    train = make_data(1280, 1)
    val = make_data(512, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=16, sampler=sampler, drop_last=True)
    model = DDP(Encoder(), static_graph=True)
    EPOCHS = 3
    total_steps = EPOCHS * len(loader)
    warmup = total_steps // 10
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total_steps - warmup))))

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        tot = torch.zeros(2)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            tot += torch.tensor([loss.item() * len(y), len(y)])
        model.eval()
        with torch.no_grad():
            vx, vy = val.tensors
            shard = slice(rank, None, world)
            acc = torch.tensor([(model(vx[shard]).argmax(1) == vy[shard]).sum().item(), vy[shard].numel()], dtype=torch.float)
        dist.all_reduce(tot)
        dist.all_reduce(acc)
        if rank == 0:
            print(f"epoch {epoch} steps {step} lr {sched.get_last_lr()[0]:.2e} "
                  f"train loss {tot[0] / tot[1]:.4f} val acc {acc[0] / acc[1]:.3f}")
    dist.barrier()
    del model, opt, sched   # drop the DDP reducer before tearing the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
