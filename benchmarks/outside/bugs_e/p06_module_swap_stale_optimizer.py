"""Layers replaced mid-training (pruning "speed-up"), optimizer still holds the old parameters.

Bug class: model surgery / module replacement after the optimizer was built
(optimizer bound to parameters that are no longer part of the model).

Modelled on: microsoft/nni#4521 "The parameters are not updated when the pruned
model is finetuned" -- ``ModelSpeedup`` replaced the layers of the model with
new (pruned) modules and copied the weights over, but the optimizer created
before still referenced the *old* parameters, so fine-tuning after pruning did
not update the model at all (maintainer's answer: "the parameters registered in
the optimizer are outdated ... reinitialize a new optimizer").  Same class as
NVIDIA/Megatron-LM#174 "Optimizer will hold unloaded model weights ...".

What goes wrong: after ``prune_model`` swaps every ``nn.Linear`` for a
``MaskedLinear`` with freshly created ``nn.Parameter``s, ``optimizer.step()``
keeps running over the detached old tensors (which no longer receive
gradients).  The live model is frozen at its post-pruning weights; the loss
just flattens out, which looks like "fine-tuning converged".

Healthy twin: rebuilds the optimizer over ``model.parameters()`` right after
the surgery, as the nni maintainers recommend.

Onset: pruning happens before optimizer step 20 (after 20 dense steps,
indices 0..19), so the first affected optimizer step is K = 20.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

D, HIDDEN, C = 40, 128, 10
BATCH = 64
TOTAL_STEPS = 55
PRUNE_AT = 20
SPARSITY = 0.5
LR = 2e-3

teacher = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, C))
for p in teacher.parameters():
    p.requires_grad_(False)


def get_batch():
    x = torch.randn(BATCH, D)
    return x, teacher(x).argmax(1)


class MaskedLinear(nn.Module):
    """Linear layer with a fixed sparsity mask (weights outside the mask are zero)."""

    def __init__(self, linear: nn.Linear, mask: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach() * mask)
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.register_buffer("mask", mask)

    def forward(self, x):
        return F.linear(x, self.weight * self.mask, self.bias)


def prune_model(model: nn.Module, amount: float):
    """Magnitude pruning: replace every nn.Linear by a MaskedLinear."""
    for name, module in list(model.named_children()):
        if isinstance(module, nn.Linear):
            w = module.weight.detach().abs().flatten()
            k = max(1, int(amount * w.numel()))
            threshold = w.kthvalue(k).values
            mask = (module.weight.detach().abs() > threshold).float()
            setattr(model, name, MaskedLinear(module, mask))
        else:
            prune_model(module, amount)


model = nn.Sequential(nn.Linear(D, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                      nn.Linear(HIDDEN, C))
optimizer = torch.optim.Adam(model.parameters(), lr=LR)

for step in range(TOTAL_STEPS):
    if step == PRUNE_AT:
        prune_model(model, SPARSITY)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"pruned {SPARSITY:.0%} of linear weights; model has {n_params} parameters")
        if HEALTHY:
            optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        else:
            # BUG: the optimizer still references the parameters of the replaced nn.Linear modules
            print(f"ONSET step {step}")
    x, y = get_batch()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0 or step == TOTAL_STEPS - 1:
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:3d} loss {loss.item():.4f} acc {acc:.3f}")

print("done")
