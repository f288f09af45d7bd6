"""Healthy probe: mp.spawn DDP with a DistributedSampler (set_epoch) and gradient accumulation under no_sync()."""
import contextlib, os, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
def run(rank, world):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=16, sampler=sampler)
    accum = 2
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(dl):
            sync = (i + 1) % accum == 0
            with (contextlib.nullcontext() if sync else model.no_sync()):
                (nn.functional.cross_entropy(model(x), y) / accum).backward()
            if sync:
                opt.step(); opt.zero_grad()
            if i >= 5: break
    dist.barrier(); dist.destroy_process_group()
if __name__ == "__main__":
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    mp.spawn(run, args=(2,), nprocs=2)
    print("done")
