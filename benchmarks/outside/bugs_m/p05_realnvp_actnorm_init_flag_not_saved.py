"""RealNVP-style normalising flow (ActNorm + affine coupling + permutation) on a 2-D density, with a
checkpoint save / reload half-way through training.

Modelled on: bayesiains/nflows#4 "Actnorm does not register `initialized` as buffer"
(https://github.com/bayesiains/nflows/issues/4): ActNorm initialises its scale and shift from the
first training batch (data-dependent initialisation, Glow) and records that in a plain Python
attribute ``self.initialized = False``.  The flag is not in the ``state_dict``, so "when you then load
a model from the state dict and continue training, the scale and shift of the actnorm layers are
re-initialized to the mean and standard deviation of the activations".  Fixed by registering it as a
buffer (same fix in VincentStimper/normalizing-flows PR #2, "Changed ActNorm flag to buffer to allow
saving").  ``--healthy`` uses the buffer.

Unusual about the loop: the first training forward of every ActNorm layer *writes* its parameters
(no gradient step involved).  The run is checkpointed at step 16 (model + Adam state to a temp file),
and a new model and optimizer are built and loaded from that file with ``strict=True``, which passes
in both variants.  The loss is the exact NLL (log-det accumulated through the flow).
"""
import math
import os
import sys
import tempfile

import torch
import torch.nn as nn

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)


def sample_data(n, gen):
    """Eight Gaussians on a ring, each stretched tangentially."""
    k = torch.randint(0, 8, (n,), generator=gen).float()
    ang = k * 2 * math.pi / 8
    centre = torch.stack([torch.cos(ang), torch.sin(ang)], 1) * 4.0
    noise = torch.randn(n, 2, generator=gen) * torch.tensor([0.25, 0.6])
    rot = torch.stack([torch.stack([torch.cos(ang), -torch.sin(ang)], 1),
                       torch.stack([torch.sin(ang), torch.cos(ang)], 1)], 1)
    return centre + (rot @ noise[:, :, None]).squeeze(-1) + torch.tensor([1.5, -0.5])


class ActNorm(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(features))
        self.shift = nn.Parameter(torch.zeros(features))
        if HEALTHY:
            self.register_buffer("initialized", torch.tensor(False))
        else:
            self.initialized = False

    def _initialize(self, inputs):
        with torch.no_grad():
            std = inputs.std(dim=0)
            mu = (inputs / std).mean(dim=0)
            self.log_scale.data.copy_(-torch.log(std))
            self.shift.data.copy_(-mu)
            if HEALTHY:
                self.initialized.fill_(True)
            else:
                self.initialized = True

    def forward(self, inputs):
        if self.training and not self.initialized:
            self._initialize(inputs)
        outputs = torch.exp(self.log_scale) * inputs + self.shift
        return outputs, self.log_scale.sum().expand(inputs.shape[0])


class AffineCoupling(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x):
        x1, x2 = x[:, :1], x[:, 1:]
        s, t = self.net(x1).chunk(2, dim=1)
        s = torch.tanh(s)
        return torch.cat([x1, x2 * torch.exp(s) + t], 1), s.sum(1)


class Reverse(nn.Module):
    def forward(self, x):
        return x.flip(1), torch.zeros(x.shape[0])


class Flow(nn.Module):
    def __init__(self, n_steps=4):
        super().__init__()
        layers = []
        for _ in range(n_steps):
            layers += [ActNorm(2), AffineCoupling(), Reverse()]
        self.layers = nn.ModuleList(layers)

    def log_prob(self, x):
        logdet = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        base = -0.5 * (x ** 2).sum(1) - math.log(2 * math.pi)
        return base + logdet


def actnorm_params(model):
    return torch.cat([torch.cat([m.log_scale.detach(), m.shift.detach()]) for m in model.modules() if isinstance(m, ActNorm)])


TOTAL, SAVE_AT = 40, 16
gen = torch.Generator().manual_seed(1)
val = sample_data(4000, torch.Generator().manual_seed(7))
model = Flow()
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
JUMP = {}


def train(model, optimizer, start, stop, saved_actnorm=None):
    model.train()
    for step in range(start, stop):
        x = sample_data(256, gen)
        nll = -model.log_prob(x).mean()
        if saved_actnorm is not None and step == start:
            JUMP["actnorm"] = (actnorm_params(model) - saved_actnorm).abs().max().item()
            JUMP["nll"] = nll.item()
        optimizer.zero_grad()
        nll.backward()
        optimizer.step()
        if step % 6 == 0 or step == stop - 1:
            print(f"step {step:3d}  train nll {nll.item():.4f}")


train(model, optimizer, 0, SAVE_AT)
with torch.no_grad():
    model.eval()
    nll_at_save = -model.log_prob(val).mean().item()
    model.train()
saved_actnorm = actnorm_params(model)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "flow_step16.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": SAVE_AT}, path)
    ckpt = torch.load(path)
model = Flow()
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
model.load_state_dict(ckpt["model"], strict=True)
optimizer.load_state_dict(ckpt["optimizer"])
if not HEALTHY:
    print(f"ONSET step {ckpt['step']}")
train(model, optimizer, ckpt["step"], TOTAL, saved_actnorm)

with torch.no_grad():
    model.eval()
    final_nll = -model.log_prob(val).mean().item()
print(f"val nll at checkpoint {nll_at_save:.4f}  final val nll {final_nll:.4f}")
print(f"EVIDENCE ActNorm params changed by the first resumed forward: max abs {JUMP['actnorm']:.4f}; "
      f"train nll at the resumed step {JUMP['nll']:.4f} (val nll at save {nll_at_save:.4f})")
