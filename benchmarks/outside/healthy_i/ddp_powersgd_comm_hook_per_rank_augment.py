"""DDP image classifier with PowerSGD gradient compression on 2 gloo ranks.

Modelled on: the PyTorch "DDP Communication Hooks" documentation, PowerSGD section
(``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``; Vogels, Karimireddy &
Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression", NeurIPS 2019, reference
code epfml/powersgd): ``PowerSGDState(process_group=None, matrix_approximation_rank=r,
start_powerSGD_iter=k)`` registered with ``ddp_model.register_comm_hook(state,
powerSGD_hook)``; vanilla all-reduce for the first ``k`` iterations, then rank-r
compression with error feedback and warm start.

What is unusual about the loop (all intentional):
  * after ``start_powerSGD_iter`` the averaged gradient is a low-rank approximation, so
    the applied update differs from the exact mean gradient; the residual is kept in a
    per-rank error-feedback buffer that is never synchronised;
  * every rank draws its data augmentation (random flips + shifts) from its own
    generator seeded with ``seed + rank``, so the ranks see different views;
  * rank 0 alone writes a checkpoint to a temporary directory and evaluates a fresh
    model restored from it while rank 1 waits at a barrier.
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)

SEED = 42
EPOCHS = 2
BATCH = 32
N_CLASSES = 6


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, N_CLASSES)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def synthetic_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(N_CLASSES, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    x = templates[y] + 1.5 * torch.randn(n, 3, 16, 16, generator=g)
    return TensorDataset(x, y)


def augment(x, gen):
    """Random horizontal flip and a random shift of up to 2 pixels, per sample."""
    flip = torch.rand(x.shape[0], generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    out = torch.empty_like(x)
    offs = torch.randint(0, 5, (x.shape[0], 2), generator=gen)
    for i, (dy, dx) in enumerate(offs.tolist()):
        out[i] = padded[i, :, dy:dy + 16, dx:dx + 16]
    return out


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(SEED)
    model = DDP(ConvNet())
    state = powerSGD.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=2,
        start_powerSGD_iter=10,
        use_error_feedback=True,
        warm_start=True,
        random_seed=SEED,
    )
    model.register_comm_hook(state, powerSGD.powerSGD_hook)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    train_set = synthetic_images(1536, seed=1)
    sampler = DistributedSampler(train_set, shuffle=True, seed=SEED)
    loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler, drop_last=True)
    steps_total = EPOCHS * len(loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1,
                                                    total_steps=steps_total, pct_start=0.25)
    aug_gen = torch.Generator().manual_seed(SEED + rank)  # rank-specific on purpose

    t0 = time.time()
    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2)
        for x, y in loader:
            x = augment(x, aug_gen)
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            running += torch.tensor([loss.item() * y.shape[0], y.shape[0]])
        dist.all_reduce(running)
        if rank == 0:
            n_err = len(state.error_dict)
            print(f"epoch {epoch} step {step} mean train loss {running[0] / running[1]:.4f} "
                  f"lr {scheduler.get_last_lr()[0]:.4f} error-feedback buffers {n_err}")

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "model.pt")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "step": step}, ckpt)
            restored = ConvNet()
            restored.load_state_dict(torch.load(ckpt)["model"])
            restored.eval()
            test = synthetic_images(600, seed=2)
            with torch.no_grad():
                pred = restored(test.tensors[0]).argmax(-1)
            acc = (pred == test.tensors[1]).float().mean().item()
            print(f"restored model test acc {acc:.3f} ({time.time() - t0:.1f}s)")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
