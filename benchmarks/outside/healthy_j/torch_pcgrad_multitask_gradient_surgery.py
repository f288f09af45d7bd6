"""Multi-task learning with PCGrad gradient surgery (two tasks, shared trunk).

Modelled on: WeiChengTseng/Pytorch-PCGrad (``pcgrad.py``: a ``PCGrad`` wrapper around a
torch optimizer whose ``pc_backward(objectives)`` backpropagates every task loss
separately with ``retain_graph=True``, flattens the per-task gradients, projects each
task gradient onto the normal plane of every conflicting one in a randomly shuffled
order, and writes the merged result back into ``p.grad``), following Yu et al.,
"Gradient Surgery for Multi-Task Learning" (NeurIPS 2020).  The data set is a synthetic
stand-in for the MultiMNIST-style "left digit / right digit" setup used in that repo.

What is unusual about the loop:
  * ``loss.backward()`` is never called on the total loss; every step runs one backward
    per task (``retain_graph=True`` for all but the last one) and the gradients the
    optimizer sees are written into ``p.grad`` by hand.
  * Conflicting gradients are projected, so the gradient of the shared trunk is not the
    gradient of the summed loss; head parameters of task B get no gradient from task A
    (the "has_grad" masks keep them from being averaged with zeros).
  * The order in which conflicts are resolved is drawn from Python's ``random`` module
    each step (seeded), as in the reference implementation.
  * As in the paper's multi-task setup, surgery is applied to the shared trunk only; the
    head parameters keep the raw gradient of the task that owns them.
  * Evaluation every 10 steps under ``torch.no_grad()`` and ``model.eval()``.
"""
import copy
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)
np.random.seed(0)


class PCGrad:
    """Optimizer wrapper applying projected conflicting gradients."""

    def __init__(self, optimizer, reduction="mean"):
        self._optim = optimizer
        self._reduction = reduction

    @property
    def optimizer(self):
        return self._optim

    def zero_grad(self):
        return self._optim.zero_grad(set_to_none=True)

    def step(self):
        return self._optim.step()

    def pc_backward(self, objectives):
        grads, shapes, has_grads = self._pack_grad(objectives)
        pc_grad, n_conflicts = self._project_conflicting(grads, has_grads)
        pc_grad = self._unflatten_grad(pc_grad, shapes[0])
        self._set_grad(pc_grad)
        return n_conflicts

    def _project_conflicting(self, grads, has_grads):
        # parameters every task touches (the trunk); heads belong to a single task
        shared = torch.stack(has_grads).prod(0).bool()
        task_grads = [g[shared] for g in grads]
        pc_grad = copy.deepcopy(task_grads)
        n_conflicts = 0
        for g_i in pc_grad:
            order = list(range(len(task_grads)))
            random.shuffle(order)
            for j in order:
                g_j = task_grads[j]
                g_i_g_j = torch.dot(g_i, g_j)
                if g_i_g_j < 0:
                    g_i -= g_i_g_j * g_j / (g_j.norm() ** 2)
                    n_conflicts += 1
        merged = torch.zeros_like(grads[0])
        if self._reduction == "mean":
            merged[shared] = torch.stack(pc_grad).mean(dim=0)
        else:
            merged[shared] = torch.stack(pc_grad).sum(dim=0)
        # task-specific parameters keep the plain gradient of the one task that owns them
        merged[~shared] = torch.stack([g[~shared] for g in grads]).sum(dim=0)
        return merged, n_conflicts

    def _set_grad(self, grads):
        idx = 0
        for group in self._optim.param_groups:
            for p in group["params"]:
                p.grad = grads[idx]
                idx += 1

    def _pack_grad(self, objectives):
        grads, shapes, has_grads = [], [], []
        for k, obj in enumerate(objectives):
            self._optim.zero_grad(set_to_none=True)
            obj.backward(retain_graph=k < len(objectives) - 1)
            grad, shape, has_grad = self._retrieve_grad()
            grads.append(torch.cat([g.flatten() for g in grad]))
            has_grads.append(torch.cat([h.flatten() for h in has_grad]))
            shapes.append(shape)
        return grads, shapes, has_grads

    def _unflatten_grad(self, grads, shapes):
        out, idx = [], 0
        for shape in shapes:
            length = int(np.prod(shape))
            out.append(grads[idx:idx + length].view(shape).clone())
            idx += length
        return out

    def _retrieve_grad(self):
        grad, shape, has_grad = [], [], []
        for group in self._optim.param_groups:
            for p in group["params"]:
                shape.append(p.shape)
                if p.grad is None:
                    grad.append(torch.zeros_like(p))
                    has_grad.append(torch.zeros_like(p))
                else:
                    grad.append(p.grad.clone())
                    has_grad.append(torch.ones_like(p))
        return grad, shape, has_grad


class MultiLeNet(nn.Module):
    """Shared encoder + two task heads (left / right digit)."""

    def __init__(self, in_dim=2 * 64, hidden=128, n_classes=10):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
        )
        self.head_left = nn.Sequential(nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, n_classes))
        self.head_right = nn.Sequential(nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, x):
        h = self.trunk(x)
        return self.head_left(h), self.head_right(h)


def make_multi_digits(n, protos, noise=0.9, seed=0):
    """Two overlapping 'digits': the right digit leaks into the left half and vice versa."""
    g = torch.Generator().manual_seed(seed)
    yl = torch.randint(0, 10, (n,), generator=g)
    yr = torch.randint(0, 10, (n,), generator=g)
    left = protos[yl] + 0.5 * protos[yr].roll(7, dims=1)
    right = protos[yr] + 0.5 * protos[yl].roll(-7, dims=1)
    x = torch.cat([left, right], dim=1) + noise * torch.randn(n, 128, generator=g)
    return x, yl, yr


@torch.no_grad()
def evaluate(model, x, yl, yr):
    model.eval()
    ol, orr = model(x)
    acc_l = (ol.argmax(1) == yl).float().mean().item()
    acc_r = (orr.argmax(1) == yr).float().mean().item()
    model.train()
    return acc_l, acc_r


def main():
    protos = torch.randn(10, 64, generator=torch.Generator().manual_seed(123))
    x_tr, yl_tr, yr_tr = make_multi_digits(4096, protos, seed=1)
    x_te, yl_te, yr_te = make_multi_digits(1024, protos, seed=2)

    model = MultiLeNet()
    optimizer = PCGrad(torch.optim.Adam(model.parameters(), lr=1e-3))
    batch_size, n_steps = 128, 60

    step = 0
    while step < n_steps:
        perm = torch.randperm(x_tr.size(0))
        for i in range(0, x_tr.size(0), batch_size):
            idx = perm[i:i + batch_size]
            out_l, out_r = model(x_tr[idx])
            loss_l = F.cross_entropy(out_l, yl_tr[idx])
            loss_r = F.cross_entropy(out_r, yr_tr[idx])

            optimizer.zero_grad()
            n_conflicts = optimizer.pc_backward([loss_l, loss_r])
            optimizer.step()
            step += 1

            if step % 10 == 0:
                acc_l, acc_r = evaluate(model, x_te, yl_te, yr_te)
                print(f"step {step:3d} loss_l {loss_l.item():.4f} loss_r {loss_r.item():.4f} "
                      f"conflicts {n_conflicts} test_acc_l {acc_l:.3f} test_acc_r {acc_r:.3f}")
            if step >= n_steps:
                break

    acc_l, acc_r = evaluate(model, x_te, yl_te, yr_te)
    print(f"final test accuracy left {acc_l:.3f} right {acc_r:.3f}")


if __name__ == "__main__":
    main()
