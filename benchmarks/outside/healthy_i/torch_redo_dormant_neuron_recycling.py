"""ReDo (Recycling Dormant neurons) on a non-stationary supervised stream.

Modelled on: Sokar, Agarwal, Castro & Evci, "The Dormant Neuron Phenomenon in Deep
Reinforcement Learning" (ICML 2023) and its reference code in google/dopamine
(``dopamine/labs/redo/weight_recyclers.py``): every ``redo_every`` steps the
activations of each hidden ReLU layer are measured on a probe batch, a neuron whose
normalised score  s_i = E|h_i| / mean_j E|h_j|  is <= tau is "dormant", and it is
recycled by re-initialising its incoming weights, zeroing its outgoing weights and
resetting the Adam moments that belong to those weights.

What is unusual about the loop (all intentional):
  * parameters are re-initialised in place in the middle of training (rows of one
    Linear, columns of the next) and the matching optimizer moments are zeroed;
  * the target function changes every ``shift_every`` steps (continual learning),
    so the loss jumps up on purpose;
  * training runs through ``torch.compile`` while the dormancy scan runs the same
    (uncompiled) module eagerly under ``no_grad``.
"""
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

IN_DIM, HIDDEN, N_CLASSES = 32, 256, 10
BATCH, STEPS = 128, 60
SHIFT_EVERY = 20
REDO_EVERY = 10
TAU = 0.1
LR = 3e-3


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN_DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, N_CLASSES)

    def forward(self, x, return_hidden=False):
        h1 = F.relu(self.fc1(x))
        h2 = F.relu(self.fc2(h1))
        out = self.head(h2)
        if return_hidden:
            return out, [h1, h2]
        return out


def make_teacher(gen):
    """A random two-layer teacher that defines the labels of the current task."""
    w1 = torch.randn(IN_DIM, 64, generator=gen) / math.sqrt(IN_DIM)
    w2 = torch.randn(64, N_CLASSES, generator=gen) / 8.0
    return lambda x: torch.tanh(x @ w1) @ w2


def sample(teacher, n, gen):
    x = torch.randn(n, IN_DIM, generator=gen)
    y = teacher(x).argmax(dim=-1)
    return x, y


@torch.no_grad()
def dormant_masks(model, probe_x, tau):
    _, hiddens = model(probe_x, return_hidden=True)
    masks = []
    for h in hiddens:
        score = h.abs().mean(dim=0)
        score = score / (score.mean() + 1e-9)
        masks.append(score <= tau)
    return masks


@torch.no_grad()
def recycle(model, optimizer, masks):
    """Re-init incoming weights, zero outgoing weights, reset their Adam moments."""
    pairs = [(model.fc1, model.fc2), (model.fc2, model.head)]
    total = 0
    for (layer_in, layer_out), mask in zip(pairs, masks):
        idx = mask.nonzero(as_tuple=True)[0]
        if idx.numel() == 0:
            continue
        total += idx.numel()
        fresh = torch.empty_like(layer_in.weight)
        nn.init.kaiming_uniform_(fresh, a=math.sqrt(5))  # same as nn.Linear's default
        layer_in.weight[idx] = fresh[idx]
        layer_in.bias[idx] = 0.0
        layer_out.weight[:, idx] = 0.0
        for p, sl in ((layer_in.weight, (idx,)), (layer_in.bias, (idx,)),
                      (layer_out.weight, (slice(None), idx))):
            state = optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key][sl] = 0.0
    return total


@torch.no_grad()
def evaluate(model, teacher, gen):
    model.eval()
    x, y = sample(teacher, 1024, gen)
    acc = (model(x).argmax(-1) == y).float().mean().item()
    model.train()
    return acc


def main():
    torch.manual_seed(0)
    data_gen = torch.Generator().manual_seed(1)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    compiled = torch.compile(model)

    teacher = make_teacher(data_gen)
    probe_x = torch.randn(512, IN_DIM, generator=torch.Generator().manual_seed(2))
    t0 = time.time()
    for step in range(1, STEPS + 1):
        if step > 1 and (step - 1) % SHIFT_EVERY == 0:
            acc = evaluate(model, teacher, torch.Generator().manual_seed(100 + step))
            print(f"step {step:3d} task shift (acc on old task {acc:.3f})")
            teacher = make_teacher(data_gen)

        x, y = sample(teacher, BATCH, data_gen)
        logits = compiled(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        if step % REDO_EVERY == 0:
            masks = dormant_masks(model, probe_x, TAU)
            n = recycle(model, optimizer, masks)
            frac = [m.float().mean().item() for m in masks]
            print(f"step {step:3d} loss {loss.item():.4f} dormant {frac[0]:.3f}/{frac[1]:.3f} "
                  f"recycled {n}")
    acc = evaluate(model, teacher, torch.Generator().manual_seed(999))
    print(f"final acc {acc:.3f}  ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
