"""DDP sequence classifier with gradual unfreezing: the encoder is unfrozen after DDP was built.

Bug class: distributed desynchronisation (gradients of parameters that were frozen
when DistributedDataParallel was constructed are never all-reduced).

Modelled on: NVIDIA/apex PR #46 "Fix param freezing" (DDP had to be changed to
allow freezing/unfreezing parameters on the fly), JDAI-CV/fast-reid#178 "Freeze
certain layers" (changing ``requires_grad`` during DDP training is unsafe, so the
project froze via the optimizer instead) and pytorch/pytorch#104148 / PR #104186
(unfreezing parameters after n steps under FSDP).  ``DistributedDataParallel``
builds its gradient reducer from the parameters that require grad at
construction time; parameters that start requiring grad later get local
``.grad`` tensors but no all-reduce hook, and nothing warns.  The program is a
plain ULMFiT-style fine-tuning loop: a Conv1d+GRU encoder (standing in for a
pretrained encoder) and a linear head, the encoder frozen for the first epoch
while the head warms up, then unfrozen with a lower learning rate, DDP over two
gloo ranks with a DistributedSampler.

What goes wrong: after unfreezing, each rank updates the encoder with its own
local gradient only.  The two replicas' encoders drift apart step by step
(the head stays synchronised), so the ranks train different models and every
later all-reduced head gradient mixes features of two different encoders.
Loss still decreases on each rank.

Healthy twin: after unfreezing, the model is re-wrapped in a fresh DDP so the
reducer covers the newly trainable parameters.

Onset: 320 sequences / 2 ranks / batch 16 = 10 optimizer steps per epoch; the
encoder is unfrozen at the start of epoch 1, so the first unsynchronised step is
K = 10.  Training runs 5 epochs = 50 steps (40 buggy).

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p05_ddp_unfreeze_after_wrap.py [--healthy]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

N_SEQ, SEQ_LEN, N_IN, N_CLASSES = 320, 40, 8, 3
BATCH = 16
EPOCHS, UNFREEZE_EPOCH = 5, 1


def make_data(gen):
    """Noisy multichannel sequences; the class sets the frequency of a hidden sinusoid."""
    y = torch.randint(0, N_CLASSES, (N_SEQ,), generator=gen)
    t = torch.arange(SEQ_LEN, dtype=torch.float32)
    freq = 0.15 + 0.12 * y.float()
    phase = torch.rand(N_SEQ, generator=gen) * 6.28
    wave = torch.sin(freq[:, None] * t[None] + phase[:, None])
    mix = torch.randn(N_IN, generator=gen)
    x = wave[:, :, None] * mix[None, None] + 0.5 * torch.randn(N_SEQ, SEQ_LEN, N_IN, generator=gen)
    return x, y


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(N_IN, 32, 5, padding=2)
        self.gru = nn.GRU(32, 48, batch_first=True)

    def forward(self, x):
        h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        out, _ = self.gru(h)
        return out.mean(1)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(48, N_CLASSES))

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical initial weights on every rank

    x, y = make_data(torch.Generator().manual_seed(8))
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    net = Classifier()
    for p in net.encoder.parameters():
        p.requires_grad_(False)  # stage 1: train the head only
    model = DDP(net)
    optimizer = torch.optim.AdamW([
        {"params": net.head.parameters(), "lr": 5e-3},
        {"params": net.encoder.parameters(), "lr": 2e-3},
    ], weight_decay=0.01)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        if epoch == UNFREEZE_EPOCH:
            for p in net.encoder.parameters():
                p.requires_grad_(True)
            if HEALTHY:
                model = DDP(net)  # rebuild the reducer so the encoder's grads are all-reduced
            elif rank == 0:
                print(f"ONSET step {step}")  # BUG: the DDP built with a frozen encoder is kept
        model.train()
        loss_sum, n = 0.0, 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(yb)
            n += len(yb)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} rank0_train_loss {loss_sum / n:.4f}")

    # replica consistency of the encoder (should be 0 when ranks are in sync)
    flat = torch.cat([p.detach().reshape(-1) for p in net.encoder.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    gap = (flat - ref).abs().max()
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"done encoder_replica_gap {gap.item():.2e}")
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
