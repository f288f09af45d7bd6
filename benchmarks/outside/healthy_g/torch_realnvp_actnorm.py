"""RealNVP normalizing flow with data-initialised ActNorm, fitted by maximum likelihood
to a 2-D two-moons distribution.

Modelled on karpathy/pytorch-normalizing-flows (``nflib/flows.py``:
``AffineHalfFlow`` coupling layers with alternating parity, ``ActNorm`` with
data-dependent initialisation on the first batch, ``NormalizingFlowModel``
returning ``zs, prior_logprob, log_det``, and the notebook loop
``loss = -(prior_logprob + log_det).mean()`` with Adam and weight decay; a cosine LR decay is added).

Unusual about the loop: the loss is a negative log-likelihood that crosses zero
and keeps falling below it (densities on a 2-D set exceed 1), the model is
trained through its own Jacobian log-determinant, and ActNorm's scale/shift are
overwritten from the first batch's statistics inside the first forward pass,
under no_grad, before any optimizer step.  400 steps.
"""
import math

import torch
import torch.nn as nn


def two_moons(n, gen):
    t = torch.rand(n, generator=gen) * math.pi
    upper = torch.rand(n, generator=gen) < 0.5
    x = torch.where(upper, torch.cos(t), 1 - torch.cos(t))
    y = torch.where(upper, torch.sin(t), 0.5 - torch.sin(t))
    pts = torch.stack([x, y], 1) + 0.05 * torch.randn(n, 2, generator=gen)
    return (pts - torch.tensor([0.5, 0.25])) * 0.5


class ActNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(1, dim))
        self.t = nn.Parameter(torch.zeros(1, dim))
        self.initialized = False

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.s.copy_(-torch.log(x.std(0, keepdim=True)))
                self.t.copy_(-(x * torch.exp(self.s)).mean(0, keepdim=True))
            self.initialized = True
        z = x * torch.exp(self.s) + self.t
        return z, self.s.sum(1).expand(x.size(0))


class AffineHalfFlow(nn.Module):
    def __init__(self, dim, parity, hidden=64):
        super().__init__()
        self.parity = parity
        half = dim // 2

        def mlp():
            return nn.Sequential(nn.Linear(half, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                 nn.LeakyReLU(0.2), nn.Linear(hidden, half))
        self.s_net, self.t_net = mlp(), mlp()

    def forward(self, x):
        x0, x1 = x[:, ::2], x[:, 1::2]
        if self.parity:
            x0, x1 = x1, x0
        s = torch.tanh(self.s_net(x0))
        z1 = torch.exp(s) * x1 + self.t_net(x0)
        z0 = x0
        if self.parity:
            z0, z1 = z1, z0
        return torch.cat([z0, z1], 1), s.sum(1)


class NormalizingFlowModel(nn.Module):
    def __init__(self, flows, dim):
        super().__init__()
        self.flows = nn.ModuleList(flows)
        self.register_buffer("loc", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    def forward(self, x):
        log_det = torch.zeros(x.size(0))
        for f in self.flows:
            x, ld = f(x)
            log_det = log_det + ld
        prior = torch.distributions.Normal(self.loc, self.scale)
        return x, prior.log_prob(x).sum(1), log_det


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    flows = []
    for i in range(6):
        flows += [ActNorm(2), AffineHalfFlow(2, parity=i % 2)]
    model = NormalizingFlowModel(flows, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-5)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=400)

    val = two_moons(2000, torch.Generator().manual_seed(2))
    for step in range(400):
        x = two_moons(128, gen)
        _, prior_logprob, log_det = model(x)
        loss = -(prior_logprob + log_det).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 50 == 0 or step == 399:
            with torch.no_grad():
                _, lp, ld = model(val)
            print(f"step {step:3d} train_nll {loss.item():+.4f} val_nll {-(lp + ld).mean().item():+.4f}")


if __name__ == "__main__":
    main()
