"""Deep Equilibrium (DEQ) image classifier trained with implicit differentiation.

Modelled on: the NeurIPS 2020 tutorial "Deep Implicit Layers - Neural ODEs, Deep Equilibrium
Models, and Beyond" by Zico Kolter, David Duvenaud and Matt Johnson, chapter 4 "Deep
Equilibrium Models" (implicit-layers-tutorial.org/deep_equilibrium_models/): the
``ResNetLayer`` cell with GroupNorm, the ``anderson`` fixed-point solver, the
``DEQFixedPoint`` module and the CIFAR-10 training loop with Adam + cosine annealing
(Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019; locuslab/deq).

What is unusual about the loop (deliberate):
  * The forward fixed point is found under ``torch.no_grad()``; only one extra
    application of the cell is put on the autograd tape.
  * The gradient that flows into the equilibrium state is *replaced* by a tensor hook
    (``z.register_hook``): the hook runs a second Anderson solve for the implicit-function
    -theorem backward fixed point, calling ``torch.autograd.grad`` inside the backward pass.
  * The cell's convolution weights are initialised very small (N(0, 0.01)) on purpose, so
    the map is contractive and the solver converges.
  * The solver's relative residuals (forward and backward) are logged as a health check.
"""
import math
import time

import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


class ResNetLayer(nn.Module):
    def __init__(self, n_channels, n_inner_channels, kernel_size=3, num_groups=8):
        super().__init__()
        self.conv1 = nn.Conv2d(n_channels, n_inner_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.conv2 = nn.Conv2d(n_inner_channels, n_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.norm1 = nn.GroupNorm(num_groups, n_inner_channels)
        self.norm2 = nn.GroupNorm(num_groups, n_channels)
        self.norm3 = nn.GroupNorm(num_groups, n_channels)
        self.conv1.weight.data.normal_(0, 0.01)
        self.conv2.weight.data.normal_(0, 0.01)

    def forward(self, z, x):
        y = self.norm1(F.relu(self.conv1(z)))
        return self.norm3(F.relu(z + self.norm2(x + self.conv2(y))))


def anderson(f, x0, m=5, lam=1e-4, max_iter=30, tol=1e-2, beta=1.0):
    """Anderson acceleration for the fixed point x = f(x)."""
    bsz, d, H, W = x0.shape
    X = torch.zeros(bsz, m, d * H * W, dtype=x0.dtype, device=x0.device)
    Fx = torch.zeros(bsz, m, d * H * W, dtype=x0.dtype, device=x0.device)
    X[:, 0], Fx[:, 0] = x0.reshape(bsz, -1), f(x0).reshape(bsz, -1)
    X[:, 1], Fx[:, 1] = Fx[:, 0], f(Fx[:, 0].view_as(x0)).reshape(bsz, -1)

    Hm = torch.zeros(bsz, m + 1, m + 1, dtype=x0.dtype, device=x0.device)
    Hm[:, 0, 1:] = Hm[:, 1:, 0] = 1
    y = torch.zeros(bsz, m + 1, 1, dtype=x0.dtype, device=x0.device)
    y[:, 0] = 1

    res = []
    k = 1
    for k in range(2, max_iter):
        n = min(k, m)
        G = Fx[:, :n] - X[:, :n]
        Hm[:, 1:n + 1, 1:n + 1] = torch.bmm(G, G.transpose(1, 2)) + lam * torch.eye(n, dtype=x0.dtype)[None]
        alpha = torch.linalg.solve(Hm[:, :n + 1, :n + 1], y[:, :n + 1])[:, 1:n + 1, 0]
        X[:, k % m] = beta * (alpha[:, None] @ Fx[:, :n])[:, 0] + (1 - beta) * (alpha[:, None] @ X[:, :n])[:, 0]
        Fx[:, k % m] = f(X[:, k % m].view_as(x0)).reshape(bsz, -1)
        res.append((Fx[:, k % m] - X[:, k % m]).norm().item() / (1e-5 + Fx[:, k % m].norm().item()))
        if res[-1] < tol:
            break
    return X[:, k % m].view_as(x0), res


class DEQFixedPoint(nn.Module):
    def __init__(self, f, solver, **kwargs):
        super().__init__()
        self.f = f
        self.solver = solver
        self.kwargs = kwargs
        self.forward_res, self.backward_res = [], []

    def forward(self, x):
        # forward pass: find the equilibrium without building a graph
        with torch.no_grad():
            z, self.forward_res = self.solver(lambda z: self.f(z, x), torch.zeros_like(x), **self.kwargs)
        # re-engage autograd with a single application of f at the fixed point
        z = self.f(z, x)
        if not z.requires_grad:  # evaluation under no_grad
            return z

        # set up the Jacobian-vector product of f at z* (no further forward calls needed)
        z0 = z.clone().detach().requires_grad_()
        f0 = self.f(z0, x)

        def backward_hook(grad):
            g, self.backward_res = self.solver(
                lambda y: autograd.grad(f0, z0, y, retain_graph=True)[0] + grad, grad, **self.kwargs)
            return g

        z.register_hook(backward_hook)
        return z


def make_dataset(n, n_classes=10, size=12, gen=None):
    """Synthetic 'CIFAR': each class is a fixed colour/orientation pattern plus noise."""
    protos = torch.randn(n_classes, 3, size, size, generator=torch.Generator().manual_seed(7))
    protos = F.avg_pool2d(protos, 3, stride=1, padding=1) * 3
    y = torch.randint(0, n_classes, (n,), generator=gen)
    x = protos[y] + 2.0 * torch.randn(n, 3, size, size, generator=gen)
    return x, y


def epoch(loader, model, opt=None, scheduler=None, tag="train"):
    total_loss, total_err, n = 0.0, 0.0, 0
    model.eval() if opt is None else model.train()
    for step, (X, y) in enumerate(loader):
        if opt is None:
            with torch.no_grad():
                yp = model(X)
                loss = nn.CrossEntropyLoss()(yp, y)
        else:
            yp = model(X)
            loss = nn.CrossEntropyLoss()(yp, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            scheduler.step()
            deq = model[2]
            if step % 5 == 0:
                print(f"  step {step:3d} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                      f"fwd-res {deq.forward_res[-1]:.2e} ({len(deq.forward_res)} it) "
                      f"bwd-res {deq.backward_res[-1]:.2e} ({len(deq.backward_res)} it)")
        total_err += (yp.argmax(dim=1) != y).sum().item()
        total_loss += loss.item() * X.shape[0]
        n += X.shape[0]
    print(f"{tag}: loss {total_loss / n:.4f} err {total_err / n:.3f}")
    return total_err / n, total_loss / n


def main():
    chan = 16
    gen = torch.Generator().manual_seed(1)
    Xtr, ytr = make_dataset(640, gen=gen)
    Xte, yte = make_dataset(256, gen=gen)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xtr, ytr), batch_size=32,
                                               shuffle=True, generator=torch.Generator().manual_seed(2))
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xte, yte), batch_size=128)

    f = ResNetLayer(chan, 32, kernel_size=3)
    model = nn.Sequential(
        nn.Conv2d(3, chan, kernel_size=3, bias=True, padding=1),
        nn.BatchNorm2d(chan),
        DEQFixedPoint(f, anderson, tol=1e-2, max_iter=25, m=5),
        nn.BatchNorm2d(chan),
        nn.AvgPool2d(4, 4),
        nn.Flatten(),
        nn.Linear(chan * 3 * 3, 10),
    )
    epochs = 2
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * len(train_loader), eta_min=1e-6)
    print("# params:", sum(p.numel() for p in model.parameters()))
    t0 = time.time()
    for ep in range(epochs):
        print(f"epoch {ep}")
        epoch(train_loader, model, opt, scheduler)
        epoch(test_loader, model, tag="test")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
