"""Jacobian regularisation (double backprop) of a small CNN, compared with an unregularised twin.

Modelled on: facebookresearch/jacobian_regularizer (Hoffman, Roberts & Yaida, "Robust Learning with
Jacobian Regularization", 2019): ``jacobian/jacobian.py`` (``JacobianReg(n=1)``: per projection a
random unit vector v per sample, ``torch.autograd.grad(flat_y, x, flat_v, retain_graph=True,
create_graph=True)`` for the Jacobian-vector product, ``R = 0.5 * C * ||Jv||^2 / (num_proj * B)``;
``n=-1`` uses all C one-hot projections for the exact Frobenius norm) and ``examples/mnist.py``
(``data.requires_grad = True`` on every batch, ``loss = loss_super + lambda_JR * R``, SGD with
momentum, an ``eval`` pass reporting supervised loss, R and accuracy).

Two identical CNNs (same init, same batches) are trained for 35 steps each, one with
lambda_JR = 0.05 and one with lambda_JR = 0; both are then evaluated on clean inputs and on inputs
with Gaussian noise drawn from a fixed-seed generator, plus the exact Jacobian norm.

Unusual but correct: the input batch is a leaf that requires grad; the loss contains a gradient
(``create_graph=True``) so backward differentiates through the first backward (second-order
terms reach the weights); a random projection is drawn from the global RNG at every step; the
evaluation pass needs autograd enabled (for the Jacobian) while the model is in eval mode and no
optimizer step is taken; two models and two optimizers are stepped in lockstep.
"""
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

N_CLASSES, SIZE = 4, 12


class JacobianReg(nn.Module):
    def __init__(self, n=1):
        assert n == -1 or n > 0
        super().__init__()
        self.n = n

    def forward(self, x, y):
        B, C = y.shape
        num_proj = C if self.n == -1 else self.n
        J2 = 0
        for ii in range(num_proj):
            if self.n == -1:
                v = torch.zeros(B, C)
                v[:, ii] = 1
            else:
                v = self._random_vector(C=C, B=B)
            Jv = self._jacobian_vector_product(y, x, v, create_graph=True)
            J2 += C * torch.norm(Jv) ** 2 / (num_proj * B)
        return 0.5 * J2

    def _random_vector(self, C, B):
        if C == 1:
            return torch.ones(B)
        v = torch.randn(B, C)
        return v / torch.norm(v, 2, 1, True)

    def _jacobian_vector_product(self, y, x, v, create_graph=False):
        grad_x, = torch.autograd.grad(y.reshape(-1), x, v.reshape(-1), retain_graph=True,
                                      create_graph=create_graph)
        return grad_x


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 3 * 3, 64)
        self.fc2 = nn.Linear(64, N_CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_gratings(n, seed):
    """Four classes of oriented sinusoidal gratings with random phase, plus noise."""
    g = np.random.default_rng(seed)
    y = g.integers(0, N_CLASSES, n)
    r = np.arange(SIZE)
    yy, xx = np.meshgrid(r, r, indexing="ij")
    angles = np.array([0, 45, 90, 135]) * np.pi / 180
    x = np.empty((n, 1, SIZE, SIZE), dtype=np.float32)
    for i, c in enumerate(y):
        phase = g.uniform(0, 2 * np.pi)
        proj = np.cos(angles[c]) * xx + np.sin(angles[c]) * yy
        x[i, 0] = np.sin(2 * np.pi * proj / 4.0 + phase)
    x += 0.6 * g.standard_normal(x.shape).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def evaluate(model, x, y, reg_full, noise_std=0.0):
    model.eval()
    gen = torch.Generator().manual_seed(2024)                  # same noise for every model
    x = (x + noise_std * torch.randn(x.shape, generator=gen)).requires_grad_(True)
    with torch.enable_grad():
        out = model(x)
        R = reg_full(x, out).item()                             # exact ||J||_F^2 / 2 (n=-1)
    acc = (out.argmax(1) == y).float().mean().item()
    model.train()
    return acc, R


def main():
    torch.manual_seed(1)
    x_train, y_train = make_gratings(35 * 64, 0)
    x_test, y_test = make_gratings(512, 1)

    base = LeNet()
    runs = {"jacobian-reg": (copy.deepcopy(base), 0.05), "plain": (copy.deepcopy(base), 0.0)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, (m, _) in runs.items()}
    reg, reg_full = JacobianReg(n=1), JacobianReg(n=-1)

    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(3))
    for step in range(35):
        idx = order[step * 64:(step + 1) * 64]
        logs = []
        for name, (model, lambda_JR) in runs.items():
            data, target = x_train[idx].clone(), y_train[idx]
            data.requires_grad = True
            opts[name].zero_grad()
            output = model(data)
            loss_super = F.cross_entropy(output, target)
            R = reg(data, output) if lambda_JR > 0 else torch.zeros(())
            loss = loss_super + lambda_JR * R
            loss.backward()
            opts[name].step()
            logs.append(f"{name}: sup {loss_super.item():.3f} R {R.item():.3f}")
        if step % 10 == 0 or step == 34:
            print(f"step {step:2d} | " + " | ".join(logs))

    for name, (model, _) in runs.items():
        clean_acc, R = evaluate(model, x_test, y_test, reg_full)
        noisy_acc, _ = evaluate(model, x_test, y_test, reg_full, noise_std=0.8)
        print(f"{name:13s} clean acc {clean_acc:.3f}  noisy acc {noisy_acc:.3f}  0.5||J||_F^2 {R:.3f}")


if __name__ == "__main__":
    main()
