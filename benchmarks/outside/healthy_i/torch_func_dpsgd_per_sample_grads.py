"""DP-SGD with per-sample gradients from torch.func (vmap + grad), no torch.optim.

Modelled on: the PyTorch tutorial "Per-sample-gradients"
(pytorch.org/tutorials/intermediate/per_sample_grads.html: ``functional_call`` +
``vmap(grad(compute_loss), in_dims=(None, None, 0, 0))``) combined with the DP-SGD
algorithm of Abadi et al. 2016 as implemented by Opacus (Poisson sampling, per-sample
L2 clipping to ``max_grad_norm``, Gaussian noise ``sigma * C``, division by the
*expected* batch size).

What is unusual about the loop (all intentional):
  * gradients never touch ``param.grad``: they are computed functionally per example,
    clipped, summed, noised, and the parameters are updated by hand with a heavy-ball
    momentum buffer under ``torch.no_grad()`` (no torch.optim object exists);
  * Poisson sampling makes the batch size vary from step to step, and the update is
    deliberately noisy (the noise is the privacy mechanism, not a bug);
  * the model uses GroupNorm instead of BatchNorm because BatchNorm mixes examples
    and would break per-sample gradients.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

torch.set_num_threads(1)

N_TRAIN, N_TEST = 4096, 1024
SAMPLE_RATE = 64 / N_TRAIN  # expected batch size 64
STEPS = 50
LR = 0.5
MOMENTUM = 0.9
MAX_GRAD_NORM = 1.0
NOISE_MULTIPLIER = 0.8


class SmallCNN(nn.Module):
    def __init__(self, n_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.gn1 = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.gn2 = nn.GroupNorm(4, 16)
        self.fc = nn.Linear(16 * 4 * 4, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.gn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.gn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def make_data(n, gen):
    """16x16 images: class = which quadrant holds a bright blob, plus noise."""
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, 1, 16, 16, generator=gen)
    for q in range(4):
        r, c = divmod(q, 2)
        sel = y == q
        x[sel, :, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 0.4
    return x, y


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x_train, y_train = make_data(N_TRAIN, gen)
    x_test, y_test = make_data(N_TEST, gen)

    model = SmallCNN()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}

    def compute_loss(p, b, sample, target):
        out = functional_call(model, (p, b), (sample.unsqueeze(0),))
        return F.cross_entropy(out, target.unsqueeze(0))

    per_sample_grad_fn = vmap(grad(compute_loss), in_dims=(None, None, 0, 0))
    expected_batch = SAMPLE_RATE * N_TRAIN
    noise_gen = torch.Generator().manual_seed(1234)
    sample_gen = torch.Generator().manual_seed(4321)

    t0 = time.time()
    for step in range(1, STEPS + 1):
        mask = torch.rand(N_TRAIN, generator=sample_gen) < SAMPLE_RATE  # Poisson sampling
        xb, yb = x_train[mask], y_train[mask]
        if xb.shape[0] == 0:
            continue
        grads = per_sample_grad_fn(params, buffers, xb, yb)

        # per-sample L2 norm over *all* parameters, then clip each example to C
        flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
        norms = flat.norm(dim=1)
        scale = (MAX_GRAD_NORM / (norms + 1e-6)).clamp(max=1.0)

        with torch.no_grad():
            for name, p in params.items():
                g = torch.einsum("b,b...->...", scale, grads[name])
                g += torch.randn(g.shape, generator=noise_gen) * NOISE_MULTIPLIER * MAX_GRAD_NORM
                g /= expected_batch
                velocity[name].mul_(MOMENTUM).add_(g)
                p.sub_(LR * velocity[name])  # p aliases the module's parameter storage

        if step % 10 == 0:
            with torch.no_grad():
                model.eval()
                acc = (model(x_test).argmax(-1) == y_test).float().mean().item()
                model.train()
            print(f"step {step:3d} batch {xb.shape[0]:3d} clipped "
                  f"{(norms > MAX_GRAD_NORM).float().mean().item():.2f} test acc {acc:.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
