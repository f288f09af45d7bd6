"""DDP (gloo, 2 CPU ranks) with deliberately uneven per-rank data, handled by the Join context
manager, and per-rank augmentation / dropout RNG.

Modelled on: pytorch/tutorials recipes_source/generic_join.rst ("Distributed Training with
Uneven Inputs Using the Join Context Manager", DistributedDataParallel + Join), combined with
the per-rank seeding convention of timm's train.py (random_seed(args.seed, args.rank)).

Unusual but intended:
  * rank 0 owns 40 batches, rank 1 only 28: with `Join([model])` the rank that runs out early
    shadows the all-reduces of the other, so rank 0 keeps taking real optimizer steps while
    rank 1 has left the loop;
  * after DDP has broadcast rank 0's initial weights, every rank re-seeds its global RNG with
    `seed + rank`, so dropout masks and the on-the-fly augmentation noise differ per rank
    (parameters stay identical because gradients are averaged);
  * evaluation runs on rank 0 only, on the unwrapped module, while rank 1 waits at a barrier.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
SEED = 17


class Net(nn.Module):
    def __init__(self, d_in=32, n_classes=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Dropout(0.3),
                                  nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.3))
        self.head = nn.Linear(64, n_classes)

    def forward(self, x):
        return self.head(self.body(x))


def make_dataset(n, w, gen):
    x = torch.randn(n, w.shape[0], generator=gen)
    y = (x @ w + 0.5 * torch.randn(n, w.shape[1], generator=gen)).argmax(1)
    return x, y


def augment(x):
    # uses the (per-rank) global RNG on purpose
    x = x + 0.1 * torch.randn_like(x)
    keep = (torch.rand(x.shape[0], x.shape[1]) > 0.1).float()
    return x * keep


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    data_gen = torch.Generator().manual_seed(SEED)  # same data tensor on every rank
    w_true = torch.randn(32, 5, generator=data_gen)
    x_all, y_all = make_dataset(4000, w_true, data_gen)
    x_val, y_val = make_dataset(1000, w_true, data_gen)

    # uneven sharding: rank 0 gets 40 batches, rank 1 gets 28
    bs = 32
    n_batches = [40, 28][rank]
    start = 0 if rank == 0 else 40 * bs
    x_loc, y_loc = x_all[start:start + n_batches * bs], y_all[start:start + n_batches * bs]

    torch.manual_seed(SEED)
    model = DDP(Net())  # broadcasts rank 0's parameters
    torch.manual_seed(SEED + rank)  # per-rank dropout / augmentation streams from here on
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)

    local_steps = 0
    model.train()
    with Join([model]):
        perm = torch.randperm(x_loc.shape[0])
        for i in range(n_batches):
            idx = perm[i * bs:(i + 1) * bs]
            logits = model(augment(x_loc[idx]))
            loss = F.cross_entropy(logits, y_loc[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            local_steps += 1
            if i % 10 == 0:
                print(f"[rank {rank}] step {i:2d} loss {loss.item():.4f}", flush=True)
    print(f"[rank {rank}] finished after {local_steps} local steps", flush=True)

    if rank == 0:
        net = model.module
        net.eval()
        with torch.no_grad():
            acc = (net(x_val).argmax(1) == y_val).float().mean().item()
        print(f"[rank 0] val acc {acc:.3f}", flush=True)
    dist.barrier()

    # sanity: parameters must still be in sync across ranks
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.allclose(flat, ref), "replicas diverged"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
