"""Lookahead wrapped around a hand-written Adam with Gradient Centralization, plus
annealed Gaussian gradient noise, training an MLP on 3-arm spirals.

Modelled on lonePatient/lookahead_pytorch (a ``Lookahead(base_optimizer, k=5, alpha=0.5)``
wrapper that keeps "slow weights" in its own state and, every k fast steps, moves
them towards the fast weights and copies them back into the parameters), on
Yonghongwei/Gradient-Centralization (``Adam_GC``: subtract from each weight
gradient of rank > 1 its mean over all but the first dimension before the Adam
update), and on Neelakantan et al., "Adding Gradient Noise Improves Learning
for Very Deep Networks" (add N(0, eta / (1 + t)^0.55) to every gradient).

Unusual about the loop: the parameters jump every 5th step when Lookahead
overwrites them with the interpolated slow weights (so the change applied in
that step is not the Adam step); the gradients the optimizer sees are first
noised and then centred, so they are never the raw backward gradients.
10 epochs x 15 steps = 150 steps.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader, TensorDataset


class AdamGC(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.dim() > 1:  # gradient centralization
                    g = g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = 1 - b1 ** st["step"], 1 - b2 ** st["step"]
                denom = (st["exp_avg_sq"] / bc2).sqrt_().add_(group["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / bc1)
        return loss


class Lookahead(Optimizer):
    def __init__(self, base_optimizer, k=5, alpha=0.5):
        self.optimizer = base_optimizer
        self.k, self.alpha = k, alpha
        self.param_groups = base_optimizer.param_groups
        self.defaults = base_optimizer.defaults
        self.state = base_optimizer.state
        self.slow = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
        self.fast_steps = 0

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.fast_steps += 1
        if self.fast_steps % self.k == 0:
            for group, slows in zip(self.param_groups, self.slow):
                for p, s in zip(group["params"], slows):
                    s.add_(p - s, alpha=self.alpha)
                    p.copy_(s)
        return loss

    def state_dict(self):
        return {"base": self.optimizer.state_dict(), "slow": self.slow, "fast_steps": self.fast_steps}


def spirals(n, gen, arms=3):
    y = torch.randint(0, arms, (n,), generator=gen)
    r = torch.rand(n, generator=gen)
    theta = r * 3.5 + y * (2 * math.pi / arms) + 0.25 * torch.randn(n, generator=gen)
    x = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], 1)
    return TensorDataset(x, y)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train = DataLoader(spirals(960, torch.Generator().manual_seed(1)), batch_size=64, shuffle=True)
    val_x, val_y = spirals(1000, torch.Generator().manual_seed(2)).tensors
    model = nn.Sequential(nn.Linear(2, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 3))
    optimizer = Lookahead(AdamGC(model.parameters(), lr=1e-2, weight_decay=1e-4), k=5, alpha=0.5)
    eta, t = 0.01, 0
    noise_gen = torch.Generator().manual_seed(3)

    for epoch in range(10):
        model.train()
        total = 0.0
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            std = math.sqrt(eta / (1 + t) ** 0.55)
            for p in model.parameters():
                p.grad.add_(torch.randn(p.grad.shape, generator=noise_gen) * std)
            optimizer.step()
            t += 1
            total += loss.item()
        model.eval()
        with torch.no_grad():
            logits = model(val_x)
            acc = (logits.argmax(1) == val_y).float().mean().item()
        print(f"epoch {epoch} train_loss {total / len(train):.4f} "
              f"val_loss {F.cross_entropy(logits, val_y).item():.4f} val_acc {acc:.3f}")


if __name__ == "__main__":
    main()
