"""MAML on sinusoid regression with torch.func (functional_call + grad + vmap).

Modelled on: pytorch/pytorch functorch/examples/maml_regression/evjang_transforms_module.py
(Eric Jang's MAML sine-regression example ported to functorch transforms), itself following
Finn et al. 2017 (cbfinn/maml).

Unusual but intended:
  * the inner-loop adaptation is a *manual* SGD update on a dict of tensors (no torch.optim),
    computed with torch.func.grad and batched over tasks with torch.func.vmap;
  * the outer (meta) loss back-propagates through the inner updates (second-order MAML), so
    the module's own .grad is filled only by the outer backward;
  * the nn.Module's parameters are never called directly during training, only through
    torch.func.functional_call;
  * meta-evaluation uses a fixed set of test tasks whose RNG is re-seeded every evaluation.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

torch.set_num_threads(1)
torch.manual_seed(42)


class SineNet(nn.Module):
    def __init__(self, hidden=40):
        super().__init__()
        self.fc1 = nn.Linear(1, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def sample_tasks(n_tasks, k_shot, gen):
    amp = torch.rand(n_tasks, 1, 1, generator=gen) * 4.9 + 0.1
    phase = torch.rand(n_tasks, 1, 1, generator=gen) * math.pi
    def draw():
        x = torch.rand(n_tasks, k_shot, 1, generator=gen) * 10.0 - 5.0
        return x, amp * torch.sin(x + phase)
    x_spt, y_spt = draw()
    x_qry, y_qry = draw()
    return x_spt, y_spt, x_qry, y_qry


def make_maml_loss(model, inner_lr, inner_steps):
    def loss_fn(params, x, y):
        return F.mse_loss(functional_call(model, params, (x,)), y)

    def adapt(params, x_spt, y_spt):
        for _ in range(inner_steps):
            g = grad(loss_fn)(params, x_spt, y_spt)
            params = {k: p - inner_lr * g[k] for k, p in params.items()}  # manual SGD step
        return params

    def task_loss(params, x_spt, y_spt, x_qry, y_qry):
        adapted = adapt(params, x_spt, y_spt)
        return loss_fn(adapted, x_qry, y_qry)

    # batch over tasks; params are shared (in_dims=None)
    return vmap(task_loss, in_dims=(None, 0, 0, 0, 0)), adapt, loss_fn


def main():
    model = SineNet()
    meta_opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batched_task_loss, adapt, loss_fn = make_maml_loss(model, inner_lr=1e-2, inner_steps=1)
    _, adapt5, _ = make_maml_loss(model, inner_lr=1e-2, inner_steps=5)  # test-time adaptation
    train_gen = torch.Generator().manual_seed(0)

    def meta_eval(seed=2024, n_tasks=32, k=10):
        g = torch.Generator().manual_seed(seed)  # same held-out tasks every evaluation
        x_spt, y_spt, x_qry, y_qry = sample_tasks(n_tasks, k, g)
        params = {k_: v.detach() for k_, v in model.named_parameters()}
        pre = vmap(loss_fn, in_dims=(None, 0, 0))(params, x_qry, y_qry).mean()
        # 5 adaptation steps at test time, still manual
        post = vmap(lambda xs, ys, xq, yq: loss_fn(adapt5(params, xs, ys), xq, yq))(x_spt, y_spt, x_qry, y_qry)
        return pre.item(), post.mean().item()

    n_iters, tasks_per_batch, k_shot = 60, 16, 10
    for it in range(n_iters):
        x_spt, y_spt, x_qry, y_qry = sample_tasks(tasks_per_batch, k_shot, train_gen)
        params = dict(model.named_parameters())
        meta_loss = batched_task_loss(params, x_spt, y_spt, x_qry, y_qry).mean()
        meta_opt.zero_grad()
        meta_loss.backward()
        meta_opt.step()
        if it % 10 == 0:
            print(f"iter {it:3d} meta-train query MSE {meta_loss.item():.3f}")
        if (it + 1) % 20 == 0:
            pre, post = meta_eval()
            print(f"  meta-eval @ {it + 1}: query MSE before adapt {pre:.3f}, after 5 steps {post:.3f}")


if __name__ == "__main__":
    main()
