"""Distributed (2-rank gloo DDP) training of a tiny conditional waveform generator (vocoder-like).

Synthetic "audio": sums of decaying sinusoids.  The generator upsamples a log-magnitude
spectrogram back to the waveform with transposed 1-D convolutions and is trained with an L1 +
multi-resolution STFT loss, like the ParallelWaveGAN generator pre-training stage.
Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_ddp_vocoder_sampler_no_set_epoch.py

Modelled on: kan-bayashi/ParallelWaveGAN issue #177 "set_epoch on DataLoader is needed for
distributed training" — the training loop used DistributedSampler(shuffle=True) but never
called `sampler.set_epoch(epoch)`, so every epoch replays exactly the same per-rank order of
examples (the sampler seeds its permutation with `seed + epoch`).

Unusual about the loop: epoch 0 is identical with or without the fix; from the first step of
epoch 1 each rank sees the same batches in the same order as in epoch 0.
--healthy: `train_sampler.set_epoch(epoch)` at the start of every epoch.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

HOP, N_FFT, CHUNK = 64, 256, 1024


class ToneDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        t = torch.arange(CHUNK) / 16000
        f = torch.rand(n, 3, 1, generator=g) * 2000 + 100
        a = torch.rand(n, 3, 1, generator=g)
        decay = torch.rand(n, 3, 1, generator=g) * 20
        self.wav = (a * torch.sin(2 * torch.pi * f * t) * torch.exp(-decay * t)).sum(1) * 0.3
        spec = torch.stft(self.wav, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True).abs()
        self.feat = torch.log(spec[:, :, :CHUNK // HOP] + 1e-5)

    def __len__(self):
        return len(self.wav)

    def __getitem__(self, i):
        return i, self.feat[i], self.wav[i]


class Generator(nn.Module):
    def __init__(self, n_bins=N_FFT // 2 + 1, ch=64):
        super().__init__()
        self.pre = nn.Conv1d(n_bins, ch, 3, padding=1)
        ups = []
        for _ in range(3):                       # 4 * 4 * 4 = 64 = HOP
            ups += [nn.LeakyReLU(0.2), nn.ConvTranspose1d(ch, ch // 2, 8, 4, padding=2)]
            ch //= 2
        self.ups = nn.Sequential(*ups)
        self.post = nn.Sequential(nn.LeakyReLU(0.2), nn.Conv1d(ch, 1, 7, padding=3), nn.Tanh())

    def forward(self, feat):
        return self.post(self.ups(self.pre(feat))).squeeze(1)


def stft_loss(pred, target):
    loss = 0.0
    for n_fft, hop in ((128, 32), (256, 64), (512, 128)):
        win = torch.hann_window(n_fft)
        p = torch.stft(pred, n_fft, hop, window=win, return_complex=True).abs() + 1e-7
        t = torch.stft(target, n_fft, hop, window=win, return_complex=True).abs() + 1e-7
        sc = (t - p).norm() / t.norm()
        mag = F.l1_loss(p.log(), t.log())
        loss = loss + sc + mag
    return loss / 3


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dataset = ToneDataset(256, seed=1)
    train_sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=8, sampler=train_sampler, drop_last=True)
    model = DDP(Generator())
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.5, 0.9))

    step, epochs = 0, 3
    seen = []
    for epoch in range(epochs):
        if HEALTHY:
            train_sampler.set_epoch(epoch)
        elif epoch == 1 and rank == 0:
            print(f"ONSET step {step}", flush=True)
        order = []
        for idx, feat, wav in loader:
            order += idx.tolist()
            pred = model(feat)
            loss = F.l1_loss(pred, wav) + stft_loss(pred, wav)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f}", flush=True)
            step += 1
        seen.append(order)

    same = torch.tensor([float(seen[e] == seen[0]) for e in range(1, epochs)])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"EVIDENCE epochs_replaying_epoch0_order={int(same.sum().item())}/{epochs - 1} "
              f"rank0_first_batch_per_epoch={[o[:4] for o in seen]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
