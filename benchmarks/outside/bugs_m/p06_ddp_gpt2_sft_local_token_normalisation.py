"""Two-rank DDP training of a tiny GPT-2: packed next-token pretraining, then completion-only SFT.

Modelled on: huggingface/transformers#34242 "Add DDP token averaging for equivalent non-parallel
training similar to #34191" (https://github.com/huggingface/transformers/issues/34242), fixed by
PR #34373 "enable average tokens across devices" (``average_tokens_across_devices``).  Each rank
divides its summed token loss by its *own* number of supervised tokens, and DDP then averages the
gradients over ranks.  A token's weight therefore depends on how many supervised tokens happened to
land on its rank, so the objective is a rank-mean of per-rank means instead of the token mean.
torchtitan fixed the same thing in PR #2206 "Fix loss computation by handling valid token imbalance
in train loop".  ``--healthy`` all-reduces the token count and normalises every rank by the global
count (times world size, to undo DDP's gradient averaging).

Unusual about the loop: two data regimes in one run.  For the first 10 steps every rank gets packed
64-token blocks, so every token is supervised and the per-rank counts are identical (the bug is
inert).  From step 10 the run switches to SFT batches with masked prompts and right padding
(labels = -100), and the per-rank counts differ.  The onset is the first step whose counts differ
across ranks (detected with an ``all_gather`` of the counts, which both variants do for logging).
Run with ``python -m torch.distributed.run --standalone --nproc-per-node 2``.
"""
import os
import random
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

CHARS = list("\n abcdefghijklmnopqrstuvwxyz0123456789+=?:.,") + ["<pad>"]
STOI = {c: i for i, c in enumerate(CHARS)}
PAD = STOI["<pad>"]


def encode(s):
    return [STOI[c] for c in s]


WORDS = "the a one two cat dog sees eats runs small big red blue tree house river near over under".split()


def pretrain_blocks(n_blocks, block, rnd):
    text = []
    while sum(len(t) for t in text) < n_blocks * block + 1:
        text.append(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(4, 9))) + ".\n")
    ids = torch.tensor(encode("".join(text))[: n_blocks * block])
    return ids.view(n_blocks, block)


def sft_example(rnd):
    a, b = rnd.randint(0, 99), rnd.randint(0, 99)
    if rnd.random() < 0.5:
        prompt = f"q: what is {a} + {b} ?\na:"
        answer = f" {a + b}\n"
    else:
        w = rnd.sample(WORDS, rnd.randint(1, 5))
        prompt = f"q: repeat {' '.join(w)}\na:"
        answer = " " + " ".join(w) + "\n"
    return encode(prompt), encode(answer)


def sft_batch(bs, rnd):
    exs = [sft_example(rnd) for _ in range(bs)]
    L = max(len(p) + len(a) for p, a in exs)
    ids = torch.full((bs, L), PAD)
    labels = torch.full((bs, L), -100)
    att = torch.zeros(bs, L, dtype=torch.long)
    for i, (p, a) in enumerate(exs):
        seq = p + a
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, len(p):len(seq)] = torch.tensor(a)  # completion-only
        att[i, :len(seq)] = 1
    return ids, att, labels


config = GPT2Config(vocab_size=len(CHARS), n_positions=96, n_embd=64, n_layer=2, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD)
model = GPT2LMHeadModel(config)
ddp = DDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1.5e-3, weight_decay=0.01)
PRE_STEPS, TOTAL = 10, 30
sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
rnd = random.Random(100 + rank)  # each rank draws its own shard

onset, ratios = None, []
for step in range(TOTAL):
    if step < PRE_STEPS:
        ids = pretrain_blocks(8, 64, rnd)
        att = torch.ones_like(ids)
        labels = ids.clone()
    else:
        ids, att, labels = sft_batch(8, rnd)
    logits = ddp(input_ids=ids, attention_mask=att).logits
    tgt = labels[:, 1:]
    ce_sum = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), tgt.reshape(-1),
                             ignore_index=-100, reduction="sum")
    n_local = (tgt != -100).sum()
    counts = [torch.zeros_like(n_local) for _ in range(world)]
    dist.all_gather(counts, n_local)
    counts = torch.stack(counts).float()
    if HEALTHY:
        n_global = n_local.clone()
        dist.all_reduce(n_global)
        loss = ce_sum * world / n_global  # DDP divides by world size again
        weights = torch.full((world,), 1.0 / counts.sum().item())
    else:
        loss = ce_sum / n_local
        weights = 1.0 / (world * counts)  # per-token weight each rank ends up with
    ratios.append((weights.max() / weights.min()).item())
    if onset is None and counts.max() != counts.min():
        onset = step
        if not HEALTHY and rank == 0:
            print(f"ONSET step {step}")
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    sched.step()
    mean_tok = torch.stack([ce_sum.detach(), n_local.float()])
    dist.all_reduce(mean_tok)
    if rank == 0 and (step % 5 == 0 or step == TOTAL - 1):
        print(f"step {step:3d}  token-mean loss {(mean_tok[0] / mean_tok[1]).item():.4f}  "
              f"supervised tokens per rank {counts.long().tolist()}")

if rank == 0:
    print(f"EVIDENCE max ratio of per-token gradient weights between ranks over the run {max(ratios):.3f}; "
          f"mean over SFT steps {sum(ratios[PRE_STEPS:]) / len(ratios[PRE_STEPS:]):.3f}")
dist.destroy_process_group()
