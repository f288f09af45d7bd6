"""Molecular property regression with a dense GCN (Kipf & Welling) trained with Hugging Face
accelerate and gradient accumulation (4 micro-batches per optimizer step).  Epoch 0 uses
the first assay only; from epoch 1 on a second assay is mixed in whose molecules have much
larger target values, which produces gradient spikes - the reason gradient clipping
(max_grad_norm = 2.0) is in the loop at all.

Modelled on: huggingface/diffusers PR #721 "[train_unconditional] fix applying
clip_grad_norm_" (fixes #499; "The gradients need to be clipped after they are synchronized
when doing accumulation") and huggingface/accelerate issue #641 "Gradient accumulation
doesn't work with Accelerate's `clip_grad_norm_`".  The loop calls
``accelerator.clip_grad_norm_`` on every micro-batch inside ``accelerator.accumulate``.
On non-sync micro-batches it clips the *partial* sum of gradients, so a spike in an early
micro-batch is squashed before the later micro-batches are added and the final
accumulated gradient is no longer the clipped average of the four.  Nothing differs while
no partial sum exceeds the limit; the first optimizer step in which one does is the first
wrong step (found at run time; seeded).  The fix clips only when
``accelerator.sync_gradients`` is True.

Unusual about the loop: ``optimizer.step()``/``lr_scheduler.step()`` are called on every
micro-batch and are no-ops except on sync steps (accelerate's wrappers), padded dense
adjacency batches, a data mixture that changes at an epoch boundary.
Run: python p12_accelerate_gnn_clip_every_microbatch.py [--healthy]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()

NMAX, FEAT, GA, MAX_NORM, EPOCHS = 12, 8, 4, 2.0, 4


def make_molecules(n, g, scale):
    sizes = torch.randint(6, NMAX + 1, (n,), generator=g)
    x = torch.zeros(n, NMAX, FEAT)
    adj = torch.zeros(n, NMAX, NMAX)
    y = torch.zeros(n)
    for i, s in enumerate(sizes.tolist()):
        x[i, :s] = F.one_hot(torch.randint(0, FEAT, (s,), generator=g), FEAT).float()
        a = (torch.rand(s, s, generator=g) < 0.3).float().triu(1)
        a = a + a.t()
        ring = torch.arange(s)
        a[ring, (ring + 1) % s] = a[(ring + 1) % s, ring] = 1.0  # backbone ring
        adj[i, :s, :s] = a
        deg = a.sum(1)
        y[i] = scale * (0.3 * (x[i, :s, :3].sum() - x[i, :s, 5:].sum()) + 0.1 * (deg * x[i, :s, 0]).sum())
    return TensorDataset(x, adj, y)


class DenseGCN(nn.Module):
    def __init__(self, hid=64):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(FEAT, hid), nn.Linear(hid, hid), nn.Linear(hid, hid)])
        self.readout = nn.Sequential(nn.Linear(hid, hid), nn.ReLU(), nn.Linear(hid, 1))

    def forward(self, x, adj):
        mask = (x.sum(-1, keepdim=True) > 0).float()
        a_hat = adj + torch.diag_embed(mask.squeeze(-1))
        d = a_hat.sum(-1).clamp(min=1).rsqrt()
        a_norm = d[:, :, None] * a_hat * d[:, None, :]
        h = x
        for lin in self.layers:
            h = F.relu(a_norm @ lin(h)) * mask
        return self.readout(h.sum(1) / mask.sum(1)).squeeze(-1)


set_seed(0)
accelerator = Accelerator(gradient_accumulation_steps=GA, cpu=True)
g = torch.Generator().manual_seed(1)
assay_a, assay_b = make_molecules(192, g, 1.0), make_molecules(64, g, 8.0)
val_ds = make_molecules(128, g, 1.0)
loaders = {
    "a": DataLoader(assay_a, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2)),
    "ab": DataLoader(ConcatDataset([assay_a, assay_b]), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)),
}
model = DenseGCN()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * 8, eta_min=1e-4)
model, optimizer, lr_scheduler, loader_a, loader_ab = accelerator.prepare(model, optimizer, lr_scheduler, loaders["a"], loaders["ab"])

global_step, onset, partial_over, rescaled_before_sync = 0, None, 0, 0
for epoch in range(EPOCHS):
    model.train()
    loader = loader_a if epoch == 0 else loader_ab
    for batch_idx, (x, adj, y) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(x, adj), y)
            accelerator.backward(loss)
            if not accelerator.sync_gradients:
                partial = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])).item()
                if partial > MAX_NORM:
                    partial_over += 1
                    if onset is None:
                        onset = global_step
                        if not args.healthy:
                            print(f"ONSET step {global_step}")
            if args.healthy:
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            else:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
                rescaled_before_sync += int(not accelerator.sync_gradients and float(grad_norm) > MAX_NORM)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            print(f"epoch {epoch} step {global_step} loss {loss.item():.4f} grad_norm {float(grad_norm):.3f} "
                  f"lr {optimizer.param_groups[0]['lr']:.2e}")
            global_step += 1

model.eval()
with torch.no_grad():
    vx, vadj, vy = val_ds.tensors
    mae = (model(vx, vadj) - vy).abs().mean().item()
print(f"EVIDENCE partial gradient sums rescaled by clipping before the accumulation window closed {rescaled_before_sync} "
      f"(micro-batches with a partial sum above max_grad_norm {partial_over}; first at optimizer step {onset}); "
      f"optimizer steps {global_step}; val MAE {mae:.4f}")
