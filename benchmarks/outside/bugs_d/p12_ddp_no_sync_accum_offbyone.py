"""P12 (class: DDP replicas drift apart -- gradient sync skipped on the optimizer-step micro-batch) -- torch.distributed (gloo).

Modelled on modelscope/FunASR PR #3472 "fix(train): align DDP no_sync with gradient
accumulation": the trainer chose the DDP context with
`model.no_sync if batch_idx % accum_grad != 0 else nullcontext`, while the optimizer steps
when `(batch_idx + 1) % accum_grad == 0`.  As the reviewer put it, the old condition
"synchronizes the first microbatch and suppresses synchronization on the optimizer-step
microbatch, leaving rank-local accumulated gradients" -- each rank then steps with its own
gradient and the DDP replicas silently diverge (DDP never re-broadcasts parameters).
Background on the semantics: pytorch/pytorch#53443 "DDP.no_sync() ...".

A small CTC acoustic model (Linear + BiGRU + CTC) on synthetic utterances, DDP over 2
CPU processes.  The recipe ramps the batch size: epoch 0 uses accum_grad=1 (every
micro-batch synced and stepped: steps 0-11), later epochs use accum_grad=2.  With the
off-by-one condition, from the first accumulated step (optimizer step 12) the gradient
of the second micro-batch of each step is never all-reduced.
Healthy twin: `(batch_idx + 1) % accum_grad != 0` selects no_sync (the fix).
Run: torchrun --nproc_per_node 2 p12_ddp_no_sync_accum_offbyone.py [--healthy]
"""
import sys, time
from contextlib import nullcontext
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DataLoader, DistributedSampler

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)

VOCAB, FEAT, FRAMES_PER_TOKEN = 10, 20, 4            # token ids 1..VOCAB, 0 = blank
BATCH, MICRO_PER_EPOCH = 8, 12
ACCUM_SCHEDULE = [1, 2, 2, 2, 2]                       # batch-size ramp: accum_grad per epoch


class SynthASR(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(99)
        self.proto = torch.randn(VOCAB + 1, FEAT, generator=g)
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(3, 7, (1,), generator=g))
            tokens = torch.randint(1, VOCAB + 1, (L,), generator=g)
            frames = self.proto[tokens].repeat_interleave(FRAMES_PER_TOKEN, 0)
            frames = frames + 0.8 * torch.randn(frames.shape, generator=g)
            self.items.append((frames, tokens))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    feats, toks = zip(*batch)
    flens = torch.tensor([len(f) for f in feats])
    tlens = torch.tensor([len(t) for t in toks])
    return (nn.utils.rnn.pad_sequence(feats, batch_first=True), flens,
            nn.utils.rnn.pad_sequence(toks, batch_first=True), tlens)


class CTCModel(nn.Module):
    def __init__(self, hid=64):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(FEAT, hid), nn.LayerNorm(hid), nn.ReLU())
        self.rnn = nn.GRU(hid, hid, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hid, VOCAB + 1)

    def forward(self, x, xlens, ys, ylens):
        h = self.inp(x)
        packed = nn.utils.rnn.pack_padded_sequence(h, xlens, batch_first=True, enforce_sorted=False)
        h, _ = self.rnn(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True)
        logp = self.out(h).log_softmax(-1).transpose(0, 1)        # (T, B, C)
        return F.ctc_loss(logp, ys, xlens, ylens, blank=0, zero_infinity=True)


@torch.no_grad()
def greedy_ter(model, loader):
    model.eval()
    errs = tot = 0
    for x, xl, ys, yl in loader:
        h = model.inp(x)
        h, _ = model.rnn(h)
        pred = model.out(h).argmax(-1)
        for b in range(len(x)):
            p = pred[b, :xl[b]].tolist()
            hyp = [t for i, t in enumerate(p) if t != 0 and (i == 0 or t != p[i - 1])]
            ref = ys[b, :yl[b]].tolist()
            errs += sum(a != b_ for a, b_ in zip(hyp, ref)) + abs(len(hyp) - len(ref))
            tot += len(ref)
    model.train()
    return errs / tot


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_ds = SynthASR(MICRO_PER_EPOCH * BATCH * world, seed=1)
    dev_ds = SynthASR(96, seed=2)
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_ds, batch_size=BATCH, sampler=sampler, collate_fn=collate, drop_last=True)
    dev_loader = DataLoader(dev_ds, batch_size=48, collate_fn=collate)

    model = DDP(CTCModel())
    optim = torch.optim.Adam(model.parameters(), lr=4e-3)
    t0 = time.time()
    step = 0
    onset_printed = False
    for epoch, accum_grad in enumerate(ACCUM_SCHEDULE):
        sampler.set_epoch(epoch)
        model.train()
        for batch_idx, (x, xl, ys, yl) in enumerate(loader):
            if HEALTHY:
                my_context = model.no_sync if (batch_idx + 1) % accum_grad != 0 else nullcontext
            else:
                my_context = model.no_sync if batch_idx % accum_grad != 0 else nullcontext
            with my_context():
                loss = model(x, xl, ys, yl)
                (loss / accum_grad).backward()
            if (batch_idx + 1) % accum_grad == 0:
                if rank == 0 and not HEALTHY and accum_grad > 1 and not onset_printed:
                    print("ONSET step", step)
                    onset_printed = True
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                optim.step()
                optim.zero_grad(set_to_none=True)
                if rank == 0 and step % 4 == 0:
                    print(f"epoch {epoch} step {step:2d} accum_grad {accum_grad} loss {loss.item():.4f}")
                step += 1
        if rank == 0:
            print(f"== epoch {epoch}: dev TER {greedy_ter(model.module, dev_loader):.3f} ({time.time() - t0:.1f}s)")
        dist.barrier()
    if rank == 0:
        print("done:", step, "optimizer steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
