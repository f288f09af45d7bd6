"""A physics-informed network for the viscous Burgers equation: Adam first, then L-BFGS.

Modelled on: the PINN recipe of Raissi, Perdikaris and Karniadakis (maziarraissi/PINNs,
``appendix/continuous_time_inference (Burgers)``) as it is usually ported to PyTorch: a
tanh MLP u(t, x), the PDE residual u_t + u u_x - nu u_xx built with
``torch.autograd.grad(create_graph=True)`` at random collocation points, initial and
boundary losses, a warm-up with Adam, then ``torch.optim.LBFGS`` with a strong-Wolfe
line search whose closure clears the gradients, evaluates the loss and back-propagates
(the line search calls it several times per step).  Steps here are optimizer steps: the
first third Adam, the rest L-BFGS.
"""

import argparse
import math

import torch
import torch.nn as nn

NU = 0.01 / math.pi


class PINN(nn.Module):
    def __init__(self, width=20, depth=4):
        super().__init__()
        layers, last = [], 2
        for _ in range(depth):
            layers += [nn.Linear(last, width), nn.Tanh()]
            last = width
        layers.append(nn.Linear(last, 1))
        self.net = nn.Sequential(*layers)
        for module in self.net:
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, t, x):
        return self.net(torch.cat([t, x], dim=1))


def residual(model, t, x):
    t = t.clone().requires_grad_(True)
    x = x.clone().requires_grad_(True)
    u = model(t, x)
    u_t, u_x = torch.autograd.grad(u, (t, x), torch.ones_like(u), create_graph=True)
    u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=True)[0]
    return u_t + u * u_x - NU * u_xx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--collocation", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    t_f, x_f = torch.rand(args.collocation, 1), torch.rand(args.collocation, 1) * 2 - 1
    x_0 = torch.linspace(-1, 1, 64).unsqueeze(1)
    t_0, u_0 = torch.zeros_like(x_0), -torch.sin(math.pi * x_0)
    t_b = torch.rand(64, 1)
    x_b = torch.where(torch.rand(64, 1) < 0.5, -torch.ones(64, 1), torch.ones(64, 1))

    model = PINN()

    def loss_fn():
        pde = residual(model, t_f, x_f).pow(2).mean()
        initial = (model(t_0, x_0) - u_0).pow(2).mean()
        boundary = model(t_b, x_b).pow(2).mean()
        return pde + initial + boundary

    adam_steps = max(1, args.steps // 3)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(adam_steps):
        adam.zero_grad()
        loss = loss_fn()
        loss.backward()
        adam.step()
        print(f"adam {step} loss {loss.item():.5f}")

    lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=4, history_size=20,
                              tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")
    for step in range(adam_steps, args.steps):
        def closure():
            lbfgs.zero_grad()
            loss = loss_fn()
            loss.backward()
            return loss

        loss = lbfgs.step(closure)
        print(f"lbfgs {step} loss {loss.item():.5f}")

    model.eval()
    with torch.no_grad():
        grid = torch.linspace(-1, 1, 5).unsqueeze(1)
        print("u(0.5, x) =", [round(v, 3) for v in model(torch.full_like(grid, 0.5), grid).squeeze(1).tolist()])


if __name__ == "__main__":
    main()
