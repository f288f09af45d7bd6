"""DiLoCo (low-communication data parallelism) for a small causal LM on 2 gloo ranks.

Modelled on: PrimeIntellect-ai/prime ``src/zeroband/diloco.py`` (the pure-PyTorch DiLoCo used for
INTELLECT-1, following OpenDiLoCo and Douillard et al., "DiLoCo: Distributed Low-Communication
Training of Language Models", 2023): an offloaded copy of the parameters owns the outer optimizer
``SGD(lr=outer_lr, momentum=0.9, nesterov=True)``; every ``num_inner_steps`` the pseudo-gradient
``param_offloaded.data - param.data`` is written into ``param_offloaded.grad`` and averaged with
``all_reduce``, the outer optimizer steps, and the result is copied back into the model
(``sync_inner_model``); in between, each worker runs its own AdamW inner optimizer (warm-up +
cosine) on its own data shard with no gradient communication at all.

Unusual but correct: there is no DDP and no gradient all-reduce; for 8 steps at a time the two
ranks' weights diverge on purpose (each rank has a different, unevenly sized data shard), then
every parameter is overwritten at once by the outer update; the inner AdamW state stays rank-local
for the whole run; the outer optimizer steps on ``.grad`` values that were assigned by hand, not
produced by backward. Averaging uses SUM / world size because gloo has no ReduceOp.AVG.
Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 THIS_FILE.py
"""
import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

VOCAB, SEQ = 32, 32


class CausalLM(nn.Module):
    def __init__(self, dim=64, depth=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        x = self.blocks(x, mask=self.mask[:idx.shape[1], :idx.shape[1]], is_causal=True)
        return self.head(self.ln(x))


class Diloco:
    def __init__(self, model, outer_lr, world_size):
        self.world_size = world_size
        self.param_list_cpu = [nn.Parameter(p.data.detach().clone(), requires_grad=False) for p in model.parameters()]
        self.outer_optimizer = torch.optim.SGD(self.param_list_cpu, lr=outer_lr, momentum=0.9, nesterov=True)

    def sync_pseudo_gradient(self, model):
        for param_offloaded, param in zip(self.param_list_cpu, model.parameters()):
            param_offloaded.grad = param_offloaded.data - param.data
            dist.all_reduce(param_offloaded.grad, op=dist.ReduceOp.SUM)
            param_offloaded.grad.div_(self.world_size)

    def sync_inner_model(self, model):
        for param_offloaded, param in zip(self.param_list_cpu, model.parameters()):
            param.data.copy_(param_offloaded.data)

    def step(self, model):
        self.sync_pseudo_gradient(model)
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad()
        self.sync_inner_model(model)


def markov_corpus(n, seed, start_states):
    """Sequences from one shared sparse Markov chain; each shard starts in its own set of states."""
    trans = np.random.default_rng(1234).dirichlet(0.1 * np.ones(VOCAB), size=VOCAB)
    g = np.random.default_rng(seed)
    seqs = np.zeros((n, SEQ + 1), dtype=np.int64)
    seqs[:, 0] = g.choice(start_states, size=n)
    for t in range(1, SEQ + 1):
        u = g.random((n, 1))
        seqs[:, t] = (np.cumsum(trans[seqs[:, t - 1]], axis=1) < u).sum(1).clip(max=VOCAB - 1)
    return torch.from_numpy(seqs)


@torch.no_grad()
def evaluate(model, data):
    model.eval()
    logits = model(data[:, :-1])
    model.train()
    return F.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1)).item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                                # same init on every rank
    model = CausalLM()

    # non-IID, uneven shards: rank 0 starts in states 0..15 (640 seqs), rank 1 in 16..31 (448 seqs)
    shard = markov_corpus(640 if rank == 0 else 448, seed=10 + rank,
                          start_states=np.arange(16) + 16 * rank)
    val = markov_corpus(256, seed=99, start_states=np.arange(VOCAB))
    g = torch.Generator().manual_seed(100 + rank)       # rank-local batch order

    num_inner_steps, outer_steps, batch_size = 8, 6, 16
    total = num_inner_steps * outer_steps
    inner_optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = 4
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        inner_optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))
    diloco = Diloco(model, outer_lr=0.7, world_size=world)

    if rank == 0:
        print(f"outer step 0: val loss {evaluate(model, val):.3f}")
    for outer_step in range(1, outer_steps + 1):
        for inner_step in range(num_inner_steps):
            idx = torch.randint(0, len(shard), (batch_size,), generator=g)
            batch = shard[idx]
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            inner_optimizer.step()
            scheduler.step()
            inner_optimizer.zero_grad()

        # before the sync the replicas differ; measure how far apart they drifted
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        other = flat.clone()
        dist.broadcast(other, src=0)
        drift = (flat - other).norm().item()
        diloco.step(model)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        other = flat.clone()
        dist.broadcast(other, src=0)
        assert torch.equal(flat, other), "replicas must be identical after the outer step"
        drift = torch.tensor([drift])
        dist.all_reduce(drift, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"outer step {outer_step}: local loss {loss.item():.3f}, replica drift before sync "
                  f"{drift.item():.3f}, val loss after sync {evaluate(model, val):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
