"""VQ-VAE with an EMA codebook and dead-code revival, trained with DDP on 2 gloo
ranks (glyph-like 8x8 images).

Modelled on: lucidrains/vector-quantize-pytorch PR #17 "Make k-means init and
EMA dead code expiry safe for distributed training": "the k-means init and EMA
dead code expiry options are not safe for use with DDP as they use vectors from
each batch on separate replicas leading to each replica having different
codebooks".  The EMA statistics are all-reduced (so codebooks stay identical
while no code dies), but when a code's EMA cluster size falls under
``threshold_ema_dead_code`` each rank replaces it with a vector sampled from
*its own* batch.  The codebook is a buffer and, as in most VQ codec trainers
(e.g. encodec-pytorch), DDP runs with ``broadcast_buffers=False``, so nothing
ever re-syncs it: from the first expiry on, the replicas quantize with
different codebooks while their encoder/decoder weights stay identical.  The
fix (``sample_vectors_distributed``) samples the replacement vectors from the
union of all ranks' batches so every replica gets the same ones.

Unusual about the loop: codebook is not a parameter (no gradient, EMA update
inside forward under no_grad), straight-through estimator, commitment loss,
per-rank data streams seeded by rank.
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 \
     p06_ddp_vqvae_dead_code_local_resample.py [--healthy]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)


def sample_vectors(samples, num, generator=None):
    idx = torch.randint(0, samples.shape[0], (num,), generator=generator)
    return samples[idx]


def sample_vectors_distributed(local_samples, num):
    """Every rank ends up with the same `num` vectors drawn from all ranks' samples."""
    world = dist.get_world_size()
    gathered = [torch.empty_like(local_samples) for _ in range(world)]
    dist.all_gather(gathered, local_samples)
    pool = torch.cat(gathered)
    idx = torch.randint(0, pool.shape[0], (num,)) if dist.get_rank() == 0 else \
        torch.empty(num, dtype=torch.long)
    dist.broadcast(idx, src=0)
    return pool[idx]


class EuclideanCodebook(nn.Module):
    def __init__(self, dim, codebook_size, decay=0.9, eps=1e-5, threshold_ema_dead_code=0.5,
                 sync_expiry=False):
        super().__init__()
        self.decay, self.eps, self.codebook_size = decay, eps, codebook_size
        self.threshold_ema_dead_code = threshold_ema_dead_code
        self.sync_expiry = sync_expiry
        embed = torch.randn(codebook_size, dim) * 0.5
        self.register_buffer("embed", embed)
        self.register_buffer("embed_avg", embed.clone())
        self.register_buffer("cluster_size", torch.ones(codebook_size))
        self.expired_total = 0
        self.first_expiry = False

    def replace(self, samples, mask):
        n = int(mask.sum())
        new = sample_vectors_distributed(samples, n) if self.sync_expiry else sample_vectors(samples, n)
        self.embed.data[mask] = new
        self.embed_avg.data[mask] = new
        self.cluster_size.data[mask] = 1.0

    def expire_codes_(self, batch_samples):
        expired = self.cluster_size < self.threshold_ema_dead_code
        if not torch.any(expired):
            return
        self.first_expiry = self.expired_total == 0
        self.expired_total += int(expired.sum())
        self.replace(batch_samples, expired)

    def forward(self, x):
        flatten = x.reshape(-1, x.shape[-1])
        dist_ = (flatten.pow(2).sum(1, keepdim=True) - 2 * flatten @ self.embed.t()
                 + self.embed.pow(2).sum(1)[None])
        ind = dist_.argmin(1)
        quantize = F.embedding(ind, self.embed).view_as(x)
        if self.training:
            with torch.no_grad():
                onehot = F.one_hot(ind, self.codebook_size).type(flatten.dtype)
                cluster_size = onehot.sum(0)
                embed_sum = onehot.t() @ flatten
                dist.all_reduce(cluster_size)
                dist.all_reduce(embed_sum)
                self.cluster_size.mul_(self.decay).add_(cluster_size, alpha=1 - self.decay)
                self.embed_avg.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
                n = self.cluster_size.sum()
                smoothed = (self.cluster_size + self.eps) / (n + self.codebook_size * self.eps) * n
                self.embed.copy_(self.embed_avg / smoothed.unsqueeze(1))
                self.expire_codes_(flatten.detach())
        return quantize, ind


class VQVAE(nn.Module):
    def __init__(self, dim=16, codebook_size=64, sync_expiry=False):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(32, dim, 4, stride=2, padding=1))
        self.codebook = EuclideanCodebook(dim, codebook_size, sync_expiry=sync_expiry)
        self.decoder = nn.Sequential(nn.ConvTranspose2d(dim, 32, 4, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv2d(32, 1, 3, padding=1))

    def forward(self, img):
        z = self.encoder(img).permute(0, 2, 3, 1)          # B,4,4,D
        q, ind = self.codebook(z)
        commit = F.mse_loss(z, q.detach())
        q = z + (q - z).detach()                            # straight-through
        recon = self.decoder(q.permute(0, 3, 1, 2))
        return recon, commit, ind


def glyph_batch(n, generator):
    imgs = torch.zeros(n, 1, 8, 8)
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
            r = int(torch.randint(0, 8, (1,), generator=generator))
            if torch.rand(1, generator=generator) < 0.5:
                imgs[i, 0, r, :] = 1.0
            else:
                imgs[i, 0, :, r] = 1.0
    return imgs + 0.05 * torch.randn(n, 1, 8, 8, generator=generator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)                      # identical init on every rank
    model = VQVAE(sync_expiry=args.healthy)
    ddp = DDP(model, broadcast_buffers=False)
    opt = torch.optim.Adam(ddp.parameters(), lr=2e-3)
    torch.manual_seed(1000 + rank)            # per-rank randomness (augmentation, sampling)
    data_gen = torch.Generator().manual_seed(rank)

    for step in range(args.steps):
        img = glyph_batch(32, data_gen)
        recon, commit, _ = ddp(img)
        loss = F.mse_loss(recon, img) + 0.25 * commit
        opt.zero_grad()
        loss.backward()
        opt.step()
        if model.codebook.first_expiry:
            model.codebook.first_expiry = False
            if rank == 0 and not args.healthy:
                print(f"ONSET step {step}")
        if rank == 0 and step % 6 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} codes revived {model.codebook.expired_total}")

    emb = model.codebook.embed.clone()
    all_emb = [torch.empty_like(emb) for _ in range(dist.get_world_size())]
    dist.all_gather(all_emb, emb)
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    all_w = [torch.empty_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(all_w, w)
    if rank == 0:
        print(f"EVIDENCE codebook max |rank0-rank1|={(all_emb[0] - all_emb[1]).abs().max().item():.4f} "
              f"| encoder/decoder weights max |rank0-rank1|={(all_w[0] - all_w[1]).abs().max().item():.6f} "
              f"| codes revived={model.codebook.expired_total}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
