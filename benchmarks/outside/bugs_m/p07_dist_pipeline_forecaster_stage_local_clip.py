"""Two-stage pipeline-parallel Transformer forecaster for multichannel sensor series (2 gloo ranks,
hand-written GPipe schedule with ``dist.send`` / ``dist.recv``), with gradient-norm clipping.

Modelled on: pytorch/torchtitan#596 "Gradient norm clipping with pipeline parallelism (PP)"
(https://github.com/pytorch/torchtitan/issues/596), fixed by PR #649 "Fix PP clip_grad_norm".  Each
pipeline rank owns only its own stage's parameters, so ``torch.nn.utils.clip_grad_norm_`` on a rank
computes the norm of *its stage only*.  Every stage is then scaled with its own, too-small norm instead
of the norm of the whole model, so clipping is weaker than requested and stage-dependent.  There is no
error.  The fix sums the squared per-stage norms across the pipeline group before clipping (also
Modalities/modalities#313).  ``--healthy`` all-reduces the squared norms and clips with
``clip_grads_with_norm_`` and the global norm.

Unusual about the loop: rank 0 holds the input projection and the first two encoder layers, rank 1 the
last two layers, the head and the loss.  Activations and their gradients travel between ranks per
micro-batch (2 micro-batches, all forwards then all backwards), and each rank has its own AdamW.  The
model is first fitted on the sensor history (steps 0-13) and then adapted online to the data recorded
after a sensor recalibration (from step 14).  The recalibrated channels have a new gain and offset,
but the deployed scaler is kept, as in production, so the loss and the gradient norm jump.  The bug can
only change an update once the global norm is above ``max_norm``.  The onset is found at run time
(both variants compute the global norm for logging).
Run with ``python -m torch.distributed.run --standalone --nproc-per-node 2``.
"""
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2

N_CH, SEQ_IN, HORIZON, D = 4, 48, 12, 48
BATCH, N_MB, STEPS, MAX_NORM, ADAPT_AT, T_RECAL = 32, 2, 36, 2.0, 14, 4000


def make_series(T, gen):
    t = torch.arange(T).float()
    daily = torch.sin(2 * math.pi * t / 24)[:, None] * torch.tensor([1.0, 0.6, -0.8, 0.3])
    weekly = torch.sin(2 * math.pi * t / 168)[:, None] * torch.tensor([0.3, 0.8, 0.2, -0.5])
    ar = torch.zeros(T, N_CH)
    eps = torch.randn(T, N_CH, generator=gen) * 0.15
    for k in range(1, T):
        ar[k] = 0.8 * ar[k - 1] + eps[k]
    x = daily + weekly + ar
    x[:, 3] += 0.5 * x[:, 0].roll(3)  # cross-channel lag
    x[T_RECAL:] = 3.0 * x[T_RECAL:] + 2.0  # sensor recalibration: new gain and offset
    mu, sd = x[:T_RECAL].mean(0), x[:T_RECAL].std(0)  # scaler fitted on the history, kept in production
    return (x - mu) / sd


series = make_series(6000, torch.Generator().manual_seed(0))  # identical on both ranks
gen = torch.Generator().manual_seed(1)


def get_batch(step):
    lo, hi = (0, T_RECAL - SEQ_IN - HORIZON) if step < ADAPT_AT else (T_RECAL - SEQ_IN // 2, len(series) - SEQ_IN - HORIZON)
    starts = torch.randint(lo, hi, (BATCH,), generator=gen)
    x = torch.stack([series[s:s + SEQ_IN] for s in starts])
    y = torch.stack([series[s + SEQ_IN:s + SEQ_IN + HORIZON] for s in starts])
    return x, y


def encoder_layer():
    return nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)


torch.manual_seed(10 + rank)
if rank == 0:
    stage = nn.ModuleDict({"inp": nn.Linear(N_CH, D), "pos": nn.Embedding(SEQ_IN, D),
                           "layers": nn.ModuleList([encoder_layer(), encoder_layer()])})

    def forward(x):
        h = stage["inp"](x) + stage["pos"].weight[None]
        for layer in stage["layers"]:
            h = layer(h)
        return h
else:
    stage = nn.ModuleDict({"layers": nn.ModuleList([encoder_layer(), encoder_layer()]),
                           "norm": nn.LayerNorm(D), "head": nn.Linear(D, HORIZON * N_CH)})

    def forward(h):
        for layer in stage["layers"]:
            h = layer(h)
        return stage["head"](stage["norm"](h[:, -1])).view(-1, HORIZON, N_CH)

params = list(stage.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def global_norm(local_params):
    sq = torch.stack([p.grad.detach().pow(2).sum() for p in local_params if p.grad is not None]).sum()
    dist.all_reduce(sq)
    return sq.sqrt()


onset, post_clip_max, gnorms = None, 0.0, []
for step in range(STEPS):
    x, y = get_batch(step)
    xs, ys = x.chunk(N_MB), y.chunk(N_MB)
    optimizer.zero_grad()
    loss_total = torch.zeros(())
    if rank == 0:
        outs = []
        for mb in xs:  # forward all micro-batches (GPipe fill)
            h = forward(mb)
            dist.send(h.detach().contiguous(), dst=1)
            outs.append(h)
        for h in outs:  # drain: receive activation gradients, backward
            g = torch.empty_like(h)
            dist.recv(g, src=1)
            h.backward(g)
    else:
        inputs, losses = [], []
        for mb_y in ys:  # forward all micro-batches
            h_in = torch.empty(mb_y.shape[0], SEQ_IN, D)
            dist.recv(h_in, src=0)
            h_in.requires_grad_(True)
            pred = forward(h_in)
            inputs.append(h_in)
            losses.append(((pred - mb_y) ** 2).mean() / N_MB)
        for h_in, loss in zip(inputs, losses):  # then all backwards, in the same order
            loss.backward()
            dist.send(h_in.grad.contiguous(), dst=0)
            loss_total += loss.detach()

    gnorm = global_norm(params)  # logged by both variants
    gnorms.append(gnorm.item())
    if HEALTHY:
        torch.nn.utils.clip_grads_with_norm_(params, MAX_NORM, gnorm)
    else:
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)  # only this stage's norm
    if onset is None and gnorm.item() > MAX_NORM:
        onset = step
        if not HEALTHY and rank == 0:
            print(f"ONSET step {step}")
    post_clip_max = max(post_clip_max, global_norm(params).item())
    optimizer.step()
    dist.broadcast(loss_total, src=1)
    if rank == 0 and (step % 4 == 0 or step == STEPS - 1):
        print(f"step {step:3d}  {'history' if step < ADAPT_AT else 'online '}  mse {loss_total.item():.4f}  global grad norm {gnorm.item():.3f}")

if rank == 0:
    print(f"EVIDENCE max global grad norm after clipping {post_clip_max:.3f} (max_norm {MAX_NORM}); "
          f"steps with pre-clip global norm above max_norm {sum(g > MAX_NORM for g in gnorms)}/{STEPS}")
dist.destroy_process_group()
