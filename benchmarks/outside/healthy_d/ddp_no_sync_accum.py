"""Modelled on the PyTorch tutorial "Getting Started with Distributed Data Parallel"
(ddp_tutorial.rst: demo_basic / demo_checkpoint, torchrun launch) combined with the
gradient-accumulation recipe from the DistributedDataParallel.no_sync() docs, applied to the
EmbeddingBag text classifier of the "Text classification with the torchtext library" tutorial.

Exercises: DDP over gloo with 2 processes; DistributedSampler with set_epoch; gradient
accumulation where the non-final micro-batches run under `ddp_model.no_sync()` (so gradients
are all-reduced only on the last micro-batch before optimizer.step()); a frozen embedding
table (requires_grad=False, therefore not part of the reducer's buckets); StepLR; rank-0-only
checkpointing followed by barrier() and map_location loading on every rank, then a check that
all replicas hold identical weights. Launch: torchrun --nproc_per_node 2 ddp_no_sync_accum.py
"""
import os
import contextlib
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

torch.set_num_threads(1)
VOCAB, EMB, NUM_CLASS, ACCUM = 500, 32, 4, 2


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, mode="mean")
        self.proj = nn.Linear(embed_dim, 64)
        self.fc = nn.Linear(64, num_class)
        self.init_weights()

    def init_weights(self):
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets=None):
        return self.fc(F.relu(self.proj(self.embedding(text, offsets))))


def make_corpus(n, seed):
    # every class owns a band of 'topic' token ids; documents mix topic and filler tokens
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASS, (n,), generator=g)
    topic = labels[:, None] * 100 + torch.randint(0, 100, (n, 12), generator=g)
    filler = torch.randint(400, VOCAB, (n, 12), generator=g)
    mask = torch.rand(n, 12, generator=g) < 0.8
    return TensorDataset(torch.where(mask, topic, filler), labels)


def pretrained_vectors():
    # stand-in for GloVe-style vectors: tokens of one topic band share a direction
    g = torch.Generator().manual_seed(123)
    topic_dirs = torch.randn(5, EMB, generator=g)
    band = torch.clamp(torch.arange(VOCAB) // 100, max=4)
    return topic_dirs[band] + 2.0 * torch.randn(VOCAB, EMB, generator=g)


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical init on every rank (DDP also broadcasts rank 0's weights)

    model = TextClassificationModel(VOCAB, EMB, NUM_CLASS)
    model.embedding.weight.data.copy_(pretrained_vectors())
    model.embedding.weight.requires_grad_(False)  # "pretrained" embedding table kept frozen
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD([p for p in ddp_model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)

    train_ds, test_ds = make_corpus(512, 0), make_corpus(128, 1)
    sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_ds, batch_size=16, sampler=sampler)

    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        ddp_model.train()
        optimizer.zero_grad()
        for i, (text, label) in enumerate(loader):
            is_sync_step = (i + 1) % ACCUM == 0 or (i + 1) == len(loader)
            ctx = contextlib.nullcontext() if is_sync_step else ddp_model.no_sync()
            with ctx:
                loss = F.cross_entropy(ddp_model(text), label) / ACCUM
                loss.backward()
            if is_sync_step:
                torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), 0.5)
                optimizer.step()
                optimizer.zero_grad()
                step += 1
        scheduler.step()
        ddp_model.eval()
        with torch.no_grad():
            text, label = test_ds.tensors
            acc = (ddp_model(text).argmax(1) == label).float().mean()
        if rank == 0:
            print(f"epoch {epoch}: optimizer steps {step}, last loss {loss.item() * ACCUM:.4f}, test acc {acc:.3f}, "
                  f"lr {scheduler.get_last_lr()[0]:.3f}")

    CHECKPOINT_PATH = "ddp_no_sync_accum_model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same random parameters
        # and gradients are synchronized in backward passes. Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)
    dist.barrier()
    map_location = {"cuda:0": "cpu"}
    ddp_model.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))

    flat = torch.cat([p.detach().flatten() for p in ddp_model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    same = torch.tensor(float(torch.equal(flat, ref)))
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        print("replicas identical:", bool(same.item()))
    dist.barrier()
    if rank == 0:
        os.remove(CHECKPOINT_PATH)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
