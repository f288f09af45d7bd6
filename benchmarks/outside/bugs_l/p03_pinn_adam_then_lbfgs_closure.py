"""Physics-informed network for a 1D steady advection-diffusion (boundary-layer)
problem, -eps*u'' + u' = 1 on (0, 1) with u(0) = u(1) = 0. Training follows the usual
PINN recipe: a short Adam phase, then L-BFGS with a strong-Wolfe line search.

Modelled on: Lightning-AI/pytorch-lightning#4083 ("LBFGS doesn't work"), fixed by PR
#6147 "Call `optimizer.zero_grad()` before backward inside closure in AutoOpt".
Lightning called ``zero_grad`` once per step, *outside* the closure, while
``torch.optim.LBFGS`` re-evaluates the closure up to ``max_iter`` times (plus the
line-search evaluations). "Lightning calls closure 20 times and zero_grad only 1 time",
so every re-evaluation adds its gradient on top of the earlier ones. The user loop
here makes the same mistake: ``zero_grad`` is called before ``step(closure)`` and the
closure only does forward + backward.

What is unusual about the loop: the optimizer changes mid-run (Adam, then L-BFGS).
Step counting runs over both phases: steps 0-11 are Adam, steps from 12 on are
L-BFGS outer steps. Each L-BFGS step evaluates the closure many times. The collocation
points are fixed (full batch), so every closure call sees the same loss.
``--healthy`` zeroes the gradients inside the closure, as the PyTorch docs require.
"""
import math
import sys

import torch
import torch.nn as nn

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
EPS = 0.1


def exact(x):
    return x - (torch.exp((x - 1) / EPS) - math.exp(-1 / EPS)) / (1 - math.exp(-1 / EPS))


class PINN(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        layers, d = [], 1
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.Tanh()]
            d = width
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


def pde_loss(model, x_col, x_bc):
    x = x_col.clone().requires_grad_(True)
    u = model(x)
    du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
    d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
    residual = -EPS * d2u + du - 1.0
    return residual.pow(2).mean() + 10.0 * model(x_bc).pow(2).mean()


def main():
    torch.manual_seed(0)
    model = PINN()
    params = list(model.parameters())
    x_col = torch.cat([torch.linspace(0, 1, 96), 1 - 0.3 * torch.rand(32)]).unsqueeze(1)  # denser in the layer
    x_bc = torch.tensor([[0.0], [1.0]])
    x_test = torch.linspace(0, 1, 201).unsqueeze(1)

    adam_steps, lbfgs_steps = 12, 14
    adam = torch.optim.Adam(params, lr=5e-3)
    lbfgs = torch.optim.LBFGS(params, lr=1.0, max_iter=8, history_size=20, line_search_fn="strong_wolfe",
                              tolerance_grad=1e-9, tolerance_change=1e-12)
    stats = {"calls": 0, "ratio": 1.0, "max_ratio": 1.0}

    def grad_ratio_probe(before):
        acc = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
        this = torch.sqrt(sum(((p.grad - b) ** 2).sum() for p, b in zip(params, before)))
        stats["ratio"] = (acc / this.clamp_min(1e-30)).item()
        stats["max_ratio"] = max(stats["max_ratio"], stats["ratio"])

    step = 0
    for _ in range(adam_steps):
        adam.zero_grad()
        loss = pde_loss(model, x_col, x_bc)
        loss.backward()
        adam.step()
        step += 1
    print(f"after Adam (step {step}): loss {loss.item():.4e}")

    for _ in range(lbfgs_steps):
        if not HEALTHY and step == adam_steps:
            print(f"ONSET step {step}")
        if not HEALTHY:
            lbfgs.zero_grad()

        def closure():
            if HEALTHY:
                lbfgs.zero_grad()
            before = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
            loss = pde_loss(model, x_col, x_bc)
            loss.backward()
            stats["calls"] += 1
            grad_ratio_probe(before)
            return loss

        loss = lbfgs.step(closure)
        if step % 4 == 3:
            print(f"step {step:2d} (L-BFGS) loss {loss.item():.4e} closure calls so far {stats['calls']}")
        step += 1

    with torch.no_grad():
        err = ((model(x_test) - exact(x_test)).norm() / exact(x_test).norm()).item()
    final = pde_loss(model, x_col, x_bc).item()
    print(f"EVIDENCE last_closure_grad_over_true_grad={stats['ratio']:.2f} max_ratio={stats['max_ratio']:.2f} "
          f"final_pde_loss={final:.3e} rel_l2_error={err:.4f}")


if __name__ == "__main__":
    main()
