"""P12 (class: DDP gradient all-reduce silently skipped -- the loss-bearing forward goes through
`ddp_model.module` instead of the DDP wrapper, so DDP's reducer is never prepared, backward() performs no
all-reduce and every rank steps on its local gradients; the replicas drift apart) -- torch.distributed DDP.

Modelled on jingyaogong/minimind#854 "[fix] route RL trainer forward through DDP so gradients all-reduce"
(fixes #853): the RL trainers wrapped the policy in DistributedDataParallel but computed the loss with
`model_unwrapped = model.module if isinstance(model, DistributedDataParallel) else model`, so "backward()
performs no all-reduce ... the replicas silently diverge.  Only rank 0 is ever saved", while the supervised
trainers (forward through the wrapper) were fine.  Same report: moojink/openvla-oft#160 "Action head gradients
are not synchronized in multi-GPU training because DDP forward is bypassed".

Program (torchrun --nproc_per_node 2): a tiny causal transformer LM; stage 1 (steps 0-11) SFT through the DDP
wrapper on "reverse the prompt" demonstrations; stage 2 (steps 12-35) DPO against a frozen reference copy, with
chosen/rejected sequences concatenated into one forward.  The buggy DPO step calls the unwrapped module.
Healthy twin: the DPO forward goes through the DDP wrapper.
"""
import argparse
import copy
import math
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--sft-steps", type=int, default=12)
parser.add_argument("--dpo-epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--beta", type=float, default=0.1)
args = parser.parse_args()
HEALTHY = args.healthy

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
VOCAB, BOS, SEP, EOS, P_LEN = 32, 1, 2, 3, 6
SEQ = 1 + P_LEN + 1 + P_LEN + 1


def build(prompt, response):
    n = prompt.size(0)
    return torch.cat([torch.full((n, 1), BOS), prompt, torch.full((n, 1), SEP), response,
                      torch.full((n, 1), EOS)], 1)


def make_pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, VOCAB, (n, P_LEN), generator=g)
    chosen = build(prompt, prompt.flip(1))  # desired: reversed prompt
    rejected = build(prompt, prompt)         # dispreferred: plain copy
    return chosen, rejected


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    def __init__(self, d=64, n_layer=2, n_head=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(SEQ, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.register_buffer("causal", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1), persistent=False)

    def forward(self, ids):
        t = ids.size(1)
        x = self.tok(ids) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.causal[:t, :t])
        return self.lm_head(self.ln_f(x))


RESP_START = 1 + P_LEN + 1  # index of first response token


def response_logps(logits, ids):
    """Sum of log-probs of the response tokens (and EOS)."""
    logp = F.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp[:, RESP_START - 1:].sum(-1)


def reduce_mean(t):
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / world


def log0(*a):
    if rank == 0:
        print(*a, flush=True)


model = DistributedDataParallel(TinyCausalLM())
global_step = 0

# ---------------- stage 1: SFT on chosen demonstrations ----------------
sft_chosen, _ = make_pairs(args.sft_steps * args.batch_size * world, seed=1)
sft_ds = TensorDataset(sft_chosen)
sft_loader = DataLoader(sft_ds, batch_size=args.batch_size, sampler=DistributedSampler(sft_ds, seed=0))
sft_opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
sft_loader.sampler.set_epoch(0)
for (ids,) in sft_loader:
    logits = model(ids)
    loss = F.cross_entropy(logits[:, RESP_START - 1:-1].reshape(-1, VOCAB), ids[:, RESP_START:].reshape(-1))
    sft_opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    sft_opt.step()
    if global_step % 4 == 0:
        log0(f"[sft] step {global_step} loss {reduce_mean(loss).item():.4f}")
    global_step += 1

# ---------------- stage 2: DPO ----------------
ref_model = copy.deepcopy(model.module).eval().requires_grad_(False)
chosen, rejected = make_pairs(8 * args.batch_size * world, seed=2)
pair_ds = TensorDataset(chosen, rejected)
sampler = DistributedSampler(pair_ds, seed=0)
loader = DataLoader(pair_ds, batch_size=args.batch_size, sampler=sampler)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
total = args.dpo_epochs * len(loader)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3) * 0.5 *
                                              (1 + math.cos(math.pi * s / total)))
val_chosen, val_rejected = make_pairs(128, seed=3)


def concatenated_forward(policy, c, r):
    ids = torch.cat([c, r], 0)
    lp = response_logps(policy(ids), ids)
    return lp[: c.size(0)], lp[c.size(0):]


@torch.no_grad()
def evaluate():
    pc, pr = concatenated_forward(model.module, val_chosen, val_rejected)
    rc, rr = concatenated_forward(ref_model, val_chosen, val_rejected)
    margin = args.beta * ((pc - rc) - (pr - rr))
    return (margin > 0).float().mean().item(), margin.mean().item()


for epoch in range(args.dpo_epochs):
    sampler.set_epoch(epoch)
    model.train()
    for c, r in loader:
        if not HEALTHY and global_step == args.sft_steps:
            log0(f"ONSET step {global_step}")
        policy = model if HEALTHY else model.module  # BUG (buggy variant): bypasses DDP's forward
        pi_c, pi_r = concatenated_forward(policy, c, r)
        with torch.no_grad():
            ref_c, ref_r = concatenated_forward(ref_model, c, r)
        logits = args.beta * ((pi_c - ref_c) - (pi_r - ref_r))
        loss = -F.logsigmoid(logits).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if global_step % 4 == 0:
            log0(f"[dpo] epoch {epoch} step {global_step} loss {reduce_mean(loss).item():.4f} "
                 f"reward_acc {reduce_mean((logits > 0).float().mean()).item():.3f} "
                 f"lr {scheduler.get_last_lr()[0]:.2e}")
        global_step += 1
    if rank == 0:
        acc, margin = evaluate()
        print(f"[dpo] epoch {epoch} eval preference_acc {acc:.3f} mean_margin {margin:.4f}", flush=True)
        torch.save({"model": model.module.state_dict(), "step": global_step}, "p12_dpo_policy.pt")
    dist.barrier()
log0(f"done: {global_step} optimizer steps")
dist.destroy_process_group()
