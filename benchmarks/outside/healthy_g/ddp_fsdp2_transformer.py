"""FSDP2 (``fully_shard``) training of a small decoder-only Transformer, two gloo ranks on CPU.

Modelled on pytorch/examples ``distributed/FSDP2/example.py`` (the FSDP2 recipe:
shard every transformer block with ``fully_shard``, then the root module,
AdamW over the sharded DTensor parameters, gradient clipping through
``clip_grad_norm_`` on DTensors, and a full state dict gathered with
``torch.distributed.checkpoint.state_dict.get_model_state_dict`` for saving).
Launch with:

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_fsdp2_transformer.py

Unusual about the loop: every parameter is a DTensor holding only this rank's
shard, so the optimizer and gradient clipping work on half of each tensor; the
full weights exist only transiently inside forward/backward (all-gather) and
when the checkpoint is gathered.  Task: next-token prediction on sequences that
follow a fixed random permutation (token t is followed by perm[t]).  60 steps.
"""
import argparse
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

VOCAB, SEQ, DIM, HEADS, LAYERS = 64, 32, 64, 4, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(DIM, dim=-1)
        q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_batch(perm, batch, gen):
    start = torch.randint(0, VOCAB, (batch,), generator=gen)
    seq = [start]
    for _ in range(SEQ):
        nxt = perm[seq[-1]]
        # 10% of the time a random token breaks the chain
        noise = torch.rand(batch, generator=gen) < 0.1
        nxt = torch.where(noise, torch.randint(0, VOCAB, (batch,), generator=gen), nxt)
        seq.append(nxt)
    seq = torch.stack(seq, 1)
    return seq[:, :-1], seq[:, 1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true", help="ignored")
    parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    torch.manual_seed(0)
    model = TinyGPT()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    total_steps, warmup = 60, 6
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))

    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(123))
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank sees different data
    for step in range(total_steps):
        x, y = make_batch(perm, 16, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        sched.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == total_steps - 1:
            l = loss.detach().clone()
            dist.all_reduce(l)
            if rank == 0:
                gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
                print(f"step {step:3d} loss {l.item() / 2:.4f} grad_norm {gn.item():.3f}")

    full_sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.pt")
            torch.save(full_sd, path)
            print(f"saved full state dict with {len(full_sd)} tensors")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
