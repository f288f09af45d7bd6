"""P11 (class: DDP replicas drift apart -- LR schedule advanced on rank 0 only) -- torch.distributed (gloo).

Modelled on rwth-i6/returnn#1493 "Different effective learning rate reported over gpus":
in 4-GPU torch training with a dev-score-driven (newbob) LR schedule, after the dev
evaluation of an epoch one process reported a lowered "effective learning rate" while the
others kept the old one (0.00018 vs 0.0002).  Related: karpathy/nanochat#857 "Fix LR
divergence across ranks in SFT".  DDP all-reduces gradients but never re-broadcasts
parameters, so once the ranks step with different learning rates the replicas silently
diverge for the rest of the run.

Frame classifier (acoustic-model style MLP over stacked feature frames), DDP over 2 CPU
processes, DistributedSampler with set_epoch, 12 optimizer steps per epoch.  The script
does all end-of-epoch work (dev evaluation, logging, checkpoint, `scheduler.step()`)
inside `if rank == 0:`.  From the first step of epoch 1 (optimizer step 12) rank 0 trains
with a decayed LR and rank 1 with the old one.
Healthy twin: `scheduler.step()` is called on every rank (after the rank-0 block).
Run: torchrun --nproc_per_node 2 p11_ddp_rank0_only_lr_step.py [--healthy]
"""
import sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)

EPOCHS, BATCH, STEPS_PER_EPOCH = 3, 32, 12
FEAT, CONTEXT, N_CLASSES = 20, 5, 12


def make_frames(n, g, proto):
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    ctx = proto[y].unsqueeze(1).expand(n, CONTEXT, FEAT)
    x = ctx + 1.6 * torch.randn(n, CONTEXT, FEAT, generator=g) + 0.3 * torch.randn(n, 1, FEAT, generator=g)
    return x.reshape(n, CONTEXT * FEAT), y


class FrameClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(CONTEXT * FEAT, 256), nn.LayerNorm(256), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(256, 256), nn.LayerNorm(256), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(256, N_CLASSES))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    tot, correct, loss = 0, 0, 0.0
    for x, y in loader:
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        tot += len(y)
    model.train()
    return loss / tot, correct / tot


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(123)
    proto = torch.randn(N_CLASSES, FEAT, generator=g) * 0.6
    train_ds = TensorDataset(*make_frames(STEPS_PER_EPOCH * BATCH * world, g, proto))
    dev_ds = TensorDataset(*make_frames(512, g, proto))
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_ds, batch_size=BATCH, sampler=sampler, drop_last=True)
    dev_loader = DataLoader(dev_ds, batch_size=256)

    model = DDP(FrameClassifier())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)   # per-epoch decay

    t0 = time.time()
    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            if rank == 0 and not HEALTHY and epoch == 1 and step == STEPS_PER_EPOCH:
                print("ONSET step", step)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step:2d} loss {loss.item():.4f} lr {optimizer.param_groups[0]['lr']:.4f}")
            step += 1

        if rank == 0:
            dev_loss, dev_acc = evaluate(model.module, dev_loader)
            print(f"== epoch {epoch}: dev loss {dev_loss:.4f} dev acc {dev_acc:.3f} ({time.time() - t0:.1f}s)")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "epoch": epoch}, "bugsd_p11_last.pt")
            if not HEALTHY:
                scheduler.step()                       # BUG: only rank 0 advances the LR schedule
        if HEALTHY:
            scheduler.step()
        dist.barrier()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
