"""MAML with derivative-order annealing (torch.func) whose second-order phase stays first-order.

Bug class: gradients silently not flowing (the meta-gradient is cut at the
inner-loop update: ``retain_graph`` passed where ``create_graph`` was meant).

Modelled on: dragen1860/MAML-Pytorch#32 "2nd Order or 1st Order
Approximation?" and #26 "bug in 2nd order?": the inner-loop gradient is taken
with ``torch.autograd.grad`` without ``create_graph=True``, so the adapted
weights are built from constant gradients and the "second-order" MAML is really
first-order; commenters in #32 tried ``retain_graph=True`` instead, which keeps
the graph alive but still does not differentiate through the gradient.  The
training program follows the MAML++ recipe (derivative-order annealing, cf.
AntreasAntoniou/HowToTrainYourMAMLPytorch: first-order meta-updates for a
warm-up, then second-order) on sinusoid regression, with the adapted weights
applied through ``torch.func.functional_call``.

What goes wrong: during the first-order warm-up both versions are identical.
When the schedule switches to second order, the buggy inner loop calls
``torch.autograd.grad(..., retain_graph=second_order)``: the inner gradients
carry no graph, so the Hessian-vector terms of the meta-gradient are silently
dropped and every later meta-update is still first-order.  The meta-loss keeps
decreasing, a little more slowly.

Healthy twin: ``create_graph=second_order`` (true second-order MAML after the
warm-up).

Onset: meta-iterations 0-11 are first-order by design; the first meta-update
meant to be second-order is optimizer step K = 12 (of 100).
"""
import math
import sys

import torch
import torch.nn as nn
from torch.func import functional_call

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

META_ITERS = 100
FIRST_ORDER_ITERS = 12
TASKS_PER_BATCH = 8
K_SHOT = 10
INNER_STEPS = 2
INNER_LR = 0.02


def sample_tasks(n, gen):
    amp = torch.rand(n, generator=gen) * 4.9 + 0.1
    phase = torch.rand(n, generator=gen) * math.pi
    return amp, phase


def sample_points(amp, phase, k, gen):
    x = torch.rand(k, 1, generator=gen) * 10 - 5
    return x, amp * torch.sin(x - phase)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1))

    def forward(self, x):
        return self.net(x)


def adapt(model, params, x_s, y_s, second_order):
    fast = dict(params)
    for _ in range(INNER_STEPS):
        loss = nn.functional.mse_loss(functional_call(model, fast, (x_s,)), y_s)
        if HEALTHY:
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=second_order)
        else:
            grads = torch.autograd.grad(loss, list(fast.values()), retain_graph=second_order)  # BUG
        fast = {name: w - INNER_LR * g for (name, w), g in zip(fast.items(), grads)}
    return fast


def main():
    model = Regressor()
    meta_opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(42)
    eval_gen = torch.Generator().manual_seed(7)
    eval_tasks = sample_tasks(16, eval_gen)
    eval_sets = [(sample_points(a, p, K_SHOT, eval_gen), sample_points(a, p, 50, eval_gen))
                 for a, p in zip(*eval_tasks)]

    for it in range(META_ITERS):
        second_order = it >= FIRST_ORDER_ITERS
        if second_order and it == FIRST_ORDER_ITERS:
            print(f"switching to second-order meta-gradients at iteration {it}")
            if not HEALTHY:
                print(f"ONSET step {it}")
        params = dict(model.named_parameters())
        meta_opt.zero_grad()
        amps, phases = sample_tasks(TASKS_PER_BATCH, gen)
        meta_loss = 0.0
        for a, p in zip(amps, phases):
            x_s, y_s = sample_points(a, p, K_SHOT, gen)
            x_q, y_q = sample_points(a, p, K_SHOT, gen)
            fast = adapt(model, params, x_s, y_s, second_order)
            meta_loss = meta_loss + nn.functional.mse_loss(functional_call(model, fast, (x_q,)), y_q)
        meta_loss = meta_loss / TASKS_PER_BATCH
        meta_loss.backward()
        meta_opt.step()

        if (it + 1) % 25 == 0:
            post = 0.0
            for (x_s, y_s), (x_q, y_q) in eval_sets:
                fast = adapt(model, dict(model.named_parameters()), x_s, y_s, second_order=False)
                post += nn.functional.mse_loss(functional_call(model, fast, (x_q,)), y_q).item()
            print(f"iter {it + 1}: meta-train loss {meta_loss.item():.3f}  "
                  f"eval post-adaptation mse {post / len(eval_sets):.3f}")
    print("done")


if __name__ == "__main__":
    main()
