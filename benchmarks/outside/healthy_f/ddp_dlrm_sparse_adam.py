"""DLRM-style click-through model with sparse EmbeddingBag tables, trained data-parallel
with SparseAdam for the tables and Adam for the MLPs.

Modelled on facebookresearch/dlrm dlrm_s_pytorch.py (bottom MLP over dense features,
EmbeddingBag(mode="sum", sparse=True) per categorical feature, pairwise dot-product
interaction, top MLP, BCE loss; in its distributed mode only the bottom and top MLPs are
wrapped in DistributedDataParallel, each separately), with the tables replicated on every
rank and their sparse gradients exchanged by hand, and with the split-optimizer arrangement recommended in the PyTorch forum
thread "Using SparseAdam together with Adam" (sparse parameters to optim.SparseAdam,
dense ones to optim.Adam). Launch:

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_dlrm_sparse_adam.py

Unusual loop: two DDP wrappers inside one model; the embedding gradients are sparse COO
tensors that bypass DDP and are averaged across ranks after backward by all-gathering
their (index, row) pairs and rebuilding a sparse gradient; two optimizers step on disjoint parameter sets every iteration; only the
rows looked up in a batch receive an update (and SparseAdam state) at all.
"""
import argparse
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

TABLE_SIZES = [500, 300, 200, 50]
EMB = 16
N_DENSE = 8


def make_logs(n, seed):
    g = torch.Generator().manual_seed(seed)
    gt = torch.Generator().manual_seed(1234)
    true_tables = [torch.randn(s, generator=gt) for s in TABLE_SIZES]
    w_dense = torch.randn(N_DENSE, generator=gt)
    dense = torch.randn(n, N_DENSE, generator=g)
    # Zipf-ish categorical ids: a few popular items, a long tail
    cats = [(torch.rand(n, generator=g) ** 3 * s).long().clamp_max(s - 1) for s in TABLE_SIZES]
    score = dense @ w_dense * 0.5 + sum(t[c] for t, c in zip(true_tables, cats)) + true_tables[0][cats[0]] * true_tables[1][cats[1]]
    click = (torch.rand(n, generator=g) < torch.sigmoid(score)).float()
    return dense, torch.stack(cats, 1), click


def mlp(sizes, last_act=True):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bot = mlp([N_DENSE, 32, EMB])
        self.emb = nn.ModuleList(nn.EmbeddingBag(s, EMB, mode="sum", sparse=True) for s in TABLE_SIZES)
        for e in self.emb:
            nn.init.uniform_(e.weight, -0.05, 0.05)
        n_feat = len(TABLE_SIZES) + 1
        self.tri = torch.triu_indices(n_feat, n_feat, offset=1)
        self.top = mlp([EMB + self.tri.size(1), 64, 1], last_act=False)

    def forward(self, dense, cats):
        z = self.bot(dense)
        offsets = torch.arange(cats.size(0))
        feats = [z] + [e(cats[:, i], offsets) for i, e in enumerate(self.emb)]
        T = torch.stack(feats, 1)                    # [B, F, D]
        inter = torch.bmm(T, T.transpose(1, 2))      # [B, F, F]
        pairs = inter[:, self.tri[0], self.tri[1]]
        return self.top(torch.cat([z, pairs], 1)).squeeze(1)


def allreduce_sparse_grad_(param, world):
    """Average a sparse COO gradient over ranks: all-gather its rows (padded to equal length)."""
    g = param.grad.coalesce()
    idx, vals = g.indices()[0], g.values()
    n = torch.tensor([idx.numel()])
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    m = int(max(c.item() for c in counts))
    idx_pad = torch.full((m,), 0, dtype=idx.dtype)
    idx_pad[:idx.numel()] = idx
    val_pad = torch.zeros(m, vals.size(1))
    val_pad[:idx.numel()] = vals
    all_idx = [torch.empty_like(idx_pad) for _ in range(world)]
    all_val = [torch.empty_like(val_pad) for _ in range(world)]
    dist.all_gather(all_idx, idx_pad)
    dist.all_gather(all_val, val_pad)
    idx_cat = torch.cat([i[:c.item()] for i, c in zip(all_idx, counts)])
    val_cat = torch.cat([v[:c.item()] for v, c in zip(all_val, counts)])
    param.grad = torch.sparse_coo_tensor(idx_cat[None], val_cat / world, param.shape).coalesce()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true", help="ignored")
    ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dense, cats, click = make_logs(8192, 1)
    vd, vc, vy = make_logs(2048, 2)
    dense, cats, click = dense[rank::world], cats[rank::world], click[rank::world]

    model = DLRM()
    model.bot = DDP(model.bot)
    model.top = DDP(model.top)
    sparse_params = [p for n, p in model.named_parameters() if n.startswith("emb.")]
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_sparse = torch.optim.SparseAdam(sparse_params, lr=0.01)
    opt_dense = torch.optim.Adam(dense_params, lr=1e-3)

    B = 64
    step = 0
    for epoch in range(2):
        perm = torch.randperm(dense.size(0), generator=torch.Generator().manual_seed(epoch))
        tot, n = 0.0, 0
        for i in range(0, dense.size(0) - B + 1, B):
            idx = perm[i:i + B]
            logit = model(dense[idx], cats[idx])
            loss = F.binary_cross_entropy_with_logits(logit, click[idx])
            opt_sparse.zero_grad()
            opt_dense.zero_grad()
            loss.backward()
            for p in sparse_params:
                allreduce_sparse_grad_(p, world)
            opt_sparse.step()
            opt_dense.step()
            step += 1
            tot += loss.item()
            n += 1
            if rank == 0 and step % 16 == 0:
                print(f"epoch {epoch} step {step} train bce {tot / n:.4f}")
                tot, n = 0.0, 0
        with torch.no_grad():
            model.eval()
            vl = F.binary_cross_entropy_with_logits(model(vd, vc), vy).item()
            model.train()
        if rank == 0:
            print(f"epoch {epoch} val bce {vl:.4f} (sparse grad: {model.emb[0].weight.grad.is_sparse})")
    emb_diff = sum(e.weight.detach().clone() for e in model.emb[:1])
    ref = emb_diff.clone()
    dist.broadcast(ref, src=0)
    print(f"rank {rank}: table 0 max diff vs rank 0 {(emb_diff - ref).abs().max().item():.1e}")
    dist.barrier()
    del model, opt_sparse, opt_dense   # drop the DDP reducers before tearing the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
