"""DeepSpeech2-style CTC acoustic model trained with DDP (2 gloo ranks) and SortaGrad.

Synthetic "speech": every utterance is a phone sequence; each phone emits a few frames of a
phone-specific 20-dim filterbank template plus noise.  Model: Conv1d front-end, bidirectional GRU,
linear CTC head (blank = 0).  SortaGrad (Amodei et al., 2016; SeanNaren/deepspeech.pytorch's
``--no-sorta-grad``): epoch 0 walks the data sorted by length with an unshuffled
``DistributedSampler``; from epoch 1 on a shuffled ``DistributedSampler`` with ``set_epoch``.
Each rank seeds its RNG with ``seed + rank`` so SpecAugment time masks differ between ranks.

Modelled on: mlcommons/training PR #625 "UNET3D - Change DistributedSampler seed to be same
across all workers" ("The DistributedSampler seed should be the same across all workers, else the
data split is not exclusive ... printing out the indexes read by each worker shows overlap (around
20% to 30%!)"), and NVlabs/LongLive#71 "DDP training ranks use divergent DistributedSampler seeds"
(fix: pass the shared seed to the sampler, keep the rank-local seed for per-rank randomness).

Unusual about the loop: the sampler is rebuilt when SortaGrad ends; the bug is that the rebuilt
sampler receives the *rank-offset* seed, so from epoch 1 the two ranks draw overlapping shards
(some utterances twice per epoch, others never).  Gradients/weights stay synchronised, so nothing
looks wrong.  ``--healthy`` passes the shared base seed to the sampler.
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 p07_ddp_ctc_sortagrad_sampler_rank_seed.py
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

torch.set_num_threads(1)
N_PHONES, FEAT, N_UTT, BATCH, EPOCHS = 8, 20, 128, 8, 4


class SynthSpeech(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        templates = torch.randn(N_PHONES + 1, FEAT, generator=g)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(3, 11, (1,), generator=g))
            labels = torch.randint(1, N_PHONES + 1, (L,), generator=g)
            frames = []
            for p in labels:
                d = int(torch.randint(3, 7, (1,), generator=g))
                frames.append(templates[p].expand(d, FEAT) + 0.6 * torch.randn(d, FEAT, generator=g))
            self.items.append((torch.cat(frames), labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        x, y = self.items[i]
        return x, y, i


class SortedView(Dataset):
    """SortaGrad epoch: same utterances, ordered by duration."""

    def __init__(self, ds):
        self.ds = ds
        self.order = sorted(range(len(ds)), key=lambda i: ds.items[i][0].size(0))

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[self.order[i]]


def collate(batch):
    xs, ys, ids = zip(*batch)
    xl, yl = torch.tensor([x.size(0) for x in xs]), torch.tensor([y.size(0) for y in ys])
    X = nn.utils.rnn.pad_sequence(xs, batch_first=True)
    return X, xl, torch.cat(ys), yl, torch.tensor(ids)


def spec_augment(X, g, width=4):
    X = X.clone()
    for b in range(X.size(0)):
        t0 = int(torch.randint(0, max(1, X.size(1) - width), (1,), generator=g))
        X[b, t0:t0 + width] = 0
    return X


class DeepSpeechLite(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(FEAT, 64, 5, padding=2), nn.BatchNorm1d(64), nn.Hardtanh(0, 20))
        self.rnn = nn.GRU(64, 64, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(128, N_PHONES + 1)

    def forward(self, X, xl):
        h = self.conv(X.transpose(1, 2)).transpose(1, 2)
        h = nn.utils.rnn.pack_padded_sequence(h, xl, batch_first=True, enforce_sorted=False)
        h, _ = self.rnn(h)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True)
        return self.fc(h).log_softmax(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.time()
    base_seed = args.seed
    torch.manual_seed(base_seed)
    dataset = SynthSpeech(N_UTT, seed=base_seed)          # identical on every rank
    model = DDP(DeepSpeechLite())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    args.seed = base_seed + rank                           # per-rank randomness (SpecAugment)
    aug_gen = torch.Generator().manual_seed(args.seed)

    step, seen = 0, {}
    for epoch in range(EPOCHS):
        if epoch == 0:   # SortaGrad: shortest utterances first, no shuffling
            sampler = DistributedSampler(SortedView(dataset), world, rank, shuffle=False)
            loader = DataLoader(SortedView(dataset), BATCH, sampler=sampler, collate_fn=collate)
        else:
            if epoch == 1:
                sampler_seed = base_seed if args.healthy else args.seed
                sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=sampler_seed)
                loader = DataLoader(dataset, BATCH, sampler=sampler, collate_fn=collate)
                if rank == 0 and not args.healthy:
                    print(f"ONSET step {step}", flush=True)
            sampler.set_epoch(epoch)
        seen[epoch] = []
        for X, xl, Y, yl, ids in loader:
            seen[epoch] += ids.tolist()
            logp = model(spec_augment(X, aug_gen), xl)
            loss = ctc(logp.transpose(0, 1), Y, xl, yl)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} ctc_loss {loss.item():.4f}", flush=True)

    overlaps, coverage = [], []
    for epoch in range(1, EPOCHS):
        mine = torch.zeros(N_UTT)
        mine[torch.tensor(seen[epoch])] = 1
        both = mine.clone()
        dist.all_reduce(both)
        overlaps.append((both == 2).float().mean().item())
        coverage.append((both > 0).float().mean().item())
    if rank == 0:
        print(f"EVIDENCE epochs 1-{EPOCHS - 1}: utterances drawn by both ranks in the same epoch "
              f"{100 * sum(overlaps) / len(overlaps):.1f}%, utterances seen per epoch "
              f"{100 * sum(coverage) / len(coverage):.1f}% (epoch 0 SortaGrad split is exact); "
              f"final ctc_loss {loss.item():.4f}")
        print(f"done in {time.time() - t0:.1f}s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
