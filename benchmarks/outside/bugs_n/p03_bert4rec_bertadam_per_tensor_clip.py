"""BERT4Rec (Sun et al., 2019) sequential recommendation: a small BertForMaskedLM over item
ids trained with the cloze objective (random items of a user's history are replaced by
[MASK] and predicted), optimised with ``BertAdam`` from pytorch-pretrained-BERT, as the
early BERT4Rec PyTorch ports did.

Modelled on: huggingface/transformers issue #581 "BertAdam gradient clipping is not global"
(fixed by PR #614 "global grad norm clipping"): ``BertAdam.step`` calls
``clip_grad_norm_(p, group['max_grad_norm'])`` for every parameter tensor separately, so each
tensor is clipped to norm 1 on its own instead of clipping the whole gradient to a global
norm of 1 as google-research/bert and Megatron do.  The fix clips all gradients jointly
once, before the per-parameter update loop.  Nothing changes while the global gradient
norm stays below ``max_grad_norm``; the first optimizer step whose global norm exceeds it
is the first one that behaves differently (found at run time; seeded).

Unusual about the loop: the optimizer itself owns warm-up + linear decay (``t_total``,
``warmup``) and gradient clipping, there is no bias correction, weight decay is added to
the Adam update (not L2 in the loss), and two parameter groups exclude biases/LayerNorm
from decay.  Masking is re-drawn every step; evaluation is HR@10 on the last item.
Run: python p03_bert4rec_bertadam_per_tensor_clip.py [--healthy]
"""
import argparse
import math

import torch
from torch.nn.utils import clip_grad_norm_
from torch.optim import Optimizer
from transformers import BertConfig, BertForMaskedLM

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

N_ITEMS, SEQ_LEN, N_USERS, BATCH, STEPS, MASK_P = 120, 20, 1024, 64, 70, 0.2
PAD, MASK = 0, N_ITEMS + 1


def warmup_linear(x, warmup=0.002):
    if x < warmup:
        return x / warmup
    return max((x - 1.0) / (warmup - 1.0), 0)


class BertAdam(Optimizer):
    """Adam with weight-decay fix, warm-up schedule and built-in gradient clipping."""

    def __init__(self, params, lr, warmup=-1, t_total=-1, b1=0.9, b2=0.999, e=1e-6, weight_decay=0.01, max_grad_norm=1.0):
        defaults = dict(lr=lr, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.fed_norms = []  # global norm of the gradients that reach the moments (for the report)

    @torch.no_grad()
    def step(self, closure=None):
        if args.healthy:  # PR #614: one global clip over every parameter of every group
            all_params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
            clip_grad_norm_(all_params, self.param_groups[0]["max_grad_norm"])
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["next_m"] = torch.zeros_like(p)
                    state["next_v"] = torch.zeros_like(p)
                next_m, next_v = state["next_m"], state["next_v"]
                if not args.healthy and group["max_grad_norm"] > 0:
                    clip_grad_norm_(p, group["max_grad_norm"])  # per-tensor clipping (the bug)
                next_m.mul_(group["b1"]).add_(grad, alpha=1 - group["b1"])
                next_v.mul_(group["b2"]).addcmul_(grad, grad, value=1 - group["b2"])
                update = next_m / (next_v.sqrt() + group["e"])
                if group["weight_decay"] > 0.0:
                    update += group["weight_decay"] * p
                lr_scheduled = group["lr"] * warmup_linear(state["step"] / group["t_total"], group["warmup"])
                p.add_(update, alpha=-lr_scheduled)
                state["step"] += 1
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.fed_norms.append(torch.norm(torch.stack([gr.norm() for gr in grads])).item())


def make_histories():
    g = torch.Generator().manual_seed(1)
    genre_of_user = torch.randint(0, 4, (N_USERS,), generator=g)
    seqs = torch.zeros(N_USERS, SEQ_LEN, dtype=torch.long)
    for u in range(N_USERS):
        base = 1 + genre_of_user[u].item() * 30
        cur = base + torch.randint(0, 30, (1,), generator=g).item()
        for t in range(SEQ_LEN):
            seqs[u, t] = cur
            step = torch.randint(1, 3, (1,), generator=g).item()
            cur = base + (cur - base + step) % 30  # items of a genre are consumed in order
    return seqs


seqs = make_histories()
train_seqs, test_targets = seqs[:, :-1], seqs[:, -1]
config = BertConfig(vocab_size=N_ITEMS + 2, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=SEQ_LEN + 2, pad_token_id=PAD,
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
model = BertForMaskedLM(config)
no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
grouped = [
    {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
]
optimizer = BertAdam(grouped, lr=2e-3, warmup=0.1, t_total=STEPS, max_grad_norm=1.0)

gen = torch.Generator().manual_seed(3)
onset = None
for step in range(STEPS):
    model.train()
    idx = torch.randint(0, N_USERS, (BATCH,), generator=gen)
    inputs = train_seqs[idx].clone()
    mask = torch.rand(inputs.shape, generator=gen) < MASK_P
    mask[:, -1] |= torch.rand(BATCH, generator=gen) < 0.5  # BERT4Rec also masks the last item often
    labels = torch.where(mask, inputs, torch.full_like(inputs, -100))
    inputs[mask] = MASK
    out = model(input_ids=inputs, attention_mask=(inputs != PAD).long(), labels=labels)
    out.loss.backward()
    raw_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])).item()
    if raw_norm > 1.0 and onset is None:
        onset = step
        if not args.healthy:
            print(f"ONSET step {step}")
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {out.loss.item():.4f} grad_norm {raw_norm:.3f} fed_norm {optimizer.fed_norms[-1]:.3f}")

model.eval()
with torch.no_grad():
    inp = torch.cat([train_seqs[:, 1:], torch.full((N_USERS, 1), MASK)], 1)
    logits = model(input_ids=inp).logits[:, -1]
    logits[:, [PAD, MASK]] = -1e9
    hr10 = (logits.topk(10, 1).indices == test_targets[:, None]).any(1).float().mean().item()
print(f"EVIDENCE max global norm of the clipped gradient fed to the Adam moments {max(optimizer.fed_norms):.3f} "
      f"(max_grad_norm 1.0; first step over the limit {onset}); HR@10 {hr10:.3f}")
