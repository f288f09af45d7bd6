"""Skip-gram with negative sampling (word2vec) trained with DDP over 2 gloo ranks.

Modelled on: Adoni/word2vec_pytorch (``model.py``: ``SkipGramModel`` with two
``nn.Embedding(..., sparse=True)`` tables, ``u_embeddings`` initialised uniform in
+-0.5/dim and ``v_embeddings`` initialised to exactly zero "like word2vec"; the loss is
``-(sum logsigmoid(u.v) + sum logsigmoid(-u.v_neg))``; ``word2vec.py`` trains with plain
``optim.SGD`` (lr 0.025 there, 0.2 here for a 60-step run) and decays the lr linearly by
writing it into the param groups; ``input_data.py`` draws negatives from the
unigram^0.75 table).  The corpus is a synthetic topic-structured text so that same-topic
words should end up close.

What is unusual about the loop:
  * Embedding gradients are sparse (``torch.sparse_coo``) and DDP all-reduces them over
    gloo; only the rows touched by some rank change in a step.
  * The context table starts at exactly zero, so at step 0 the centre-word embeddings
    get an all-zero gradient and do not move; only ``v`` moves in the first step.
  * Negative samples come from a per-rank ``torch.Generator`` seeded with seed + rank,
    so the two ranks draw different negatives on purpose (the averaged gradient keeps
    the replicas identical).
  * The learning rate is set by hand every step (linear decay to 1e-4 x initial), no
    scheduler object.
  * Rank 0 alone evaluates (topic-coherence of cosine neighbours) while rank 1 waits at
    a barrier; at the end the ranks check that their weights are bit-identical.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)

VOCAB, N_TOPICS, DIM, WINDOW, NEG = 400, 8, 32, 2, 5


class SkipGramModel(nn.Module):
    def __init__(self, emb_size, emb_dimension):
        super().__init__()
        self.emb_size = emb_size
        self.emb_dimension = emb_dimension
        self.u_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        self.v_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        self.init_emb()

    def init_emb(self):
        initrange = 0.5 / self.emb_dimension
        self.u_embeddings.weight.data.uniform_(-initrange, initrange)
        self.v_embeddings.weight.data.zero_()

    def forward(self, pos_u, pos_v, neg_v):
        emb_u = self.u_embeddings(pos_u)                       # B x D
        emb_v = self.v_embeddings(pos_v)                       # B x D
        score = F.logsigmoid(torch.sum(emb_u * emb_v, dim=1))
        neg_emb_v = self.v_embeddings(neg_v)                   # B x NEG x D
        neg_score = torch.bmm(neg_emb_v, emb_u.unsqueeze(2)).squeeze(2)
        neg_score = F.logsigmoid(-neg_score).sum(dim=1)
        return -(score.sum() + neg_score.sum())


def build_corpus(n_sentences=1200, length=12, seed=0):
    """Each sentence is drawn from one topic; word ids are blocked by topic."""
    g = torch.Generator().manual_seed(seed)
    per_topic = VOCAB // N_TOPICS
    # Zipf-like frequencies inside each topic
    ranks = torch.arange(1, per_topic + 1, dtype=torch.float)
    within = (1.0 / ranks) / (1.0 / ranks).sum()
    topics = torch.randint(0, N_TOPICS, (n_sentences,), generator=g)
    words = torch.multinomial(within, n_sentences * length, replacement=True, generator=g)
    words = words.view(n_sentences, length) + topics.unsqueeze(1) * per_topic
    # 10% of tokens are topic-free noise words
    noise = torch.rand(n_sentences, length, generator=g) < 0.1
    words[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=g)
    return words


def skipgram_pairs(corpus):
    us, vs = [], []
    n, length = corpus.shape
    for offset in range(1, WINDOW + 1):
        us += [corpus[:, :-offset].reshape(-1), corpus[:, offset:].reshape(-1)]
        vs += [corpus[:, offset:].reshape(-1), corpus[:, :-offset].reshape(-1)]
    return torch.cat(us), torch.cat(vs)


@torch.no_grad()
def topic_precision(model, k=5):
    emb = F.normalize(model.u_embeddings.weight, dim=1)
    sim = emb @ emb.T
    sim.fill_diagonal_(-2.0)
    nn_idx = sim.topk(k, dim=1).indices
    per_topic = VOCAB // N_TOPICS
    same = (nn_idx // per_topic) == (torch.arange(VOCAB) // per_topic).unsqueeze(1)
    return same.float().mean().item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical init on every rank (DDP also broadcasts rank 0's)

    corpus = build_corpus()
    pos_u, pos_v = skipgram_pairs(corpus)
    counts = torch.bincount(corpus.view(-1), minlength=VOCAB).float()
    neg_table = counts.pow(0.75) / counts.pow(0.75).sum()

    dataset = TensorDataset(pos_u, pos_v)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=512, sampler=sampler, drop_last=True)

    model = SkipGramModel(VOCAB, DIM)
    ddp_model = DDP(model)
    initial_lr = 0.2
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=initial_lr)
    neg_gen = torch.Generator().manual_seed(1000 + rank)

    total_steps, step = 60, 0
    if rank == 0:
        print(f"pairs {len(dataset)}, steps/epoch/rank {len(loader)}, "
              f"topic precision@5 at init {topic_precision(model):.3f}")
    epoch = 0
    while step < total_steps:
        sampler.set_epoch(epoch)
        for u, v in loader:
            lr = max(initial_lr * (1.0 - step / total_steps), initial_lr * 1e-4)
            for group in optimizer.param_groups:
                group["lr"] = lr
            neg_v = torch.multinomial(neg_table, u.size(0) * NEG, replacement=True,
                                      generator=neg_gen).view(u.size(0), NEG)
            optimizer.zero_grad()
            loss = ddp_model(u, v, neg_v)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 15 == 0:
                loss_avg = loss.detach() / u.size(0)
                dist.all_reduce(loss_avg)
                loss_avg /= world
                if rank == 0:
                    print(f"step {step:3d} epoch {epoch} lr {lr:.5f} loss/pair {loss_avg.item():.4f} "
                          f"topic precision@5 {topic_precision(model):.3f}")
                dist.barrier()
            if step >= total_steps:
                break
        epoch += 1

    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        max_diff = max((g - gathered[0]).abs().max().item() for g in gathered)
        print(f"final topic precision@5 {topic_precision(model):.3f}; "
              f"max weight difference across ranks {max_diff:.3e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
