"""Modelled on pytorch/functorch examples/maml_regression/evjang_transforms_module.py
(now pytorch/pytorch functorch/examples/maml_regression) -- MAML on sine-wave regression
(Finn et al. 2017) written with torch.func.

The model is an nn.Module, used functionally via torch.func.functional_call; the inner-loop
adaptation uses torch.func.grad (second-order: the outer gradient flows through the inner
update), and the per-task inner loop is vectorised over the meta-batch with torch.func.vmap.
Outer loop: Adam on the meta-parameters, 40 meta-steps; evaluation of post-adaptation loss
on fresh tasks under no outer graph; meta-parameters checkpointed."""
import math
import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap

torch.manual_seed(0)

class ThreeLayerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1, 40)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(40, 40)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(40, 1)

    def forward(self, x):
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))

def mse_loss(x, y):
    return torch.mean((x - y) ** 2)

net = ThreeLayerNet()
params = dict(net.named_parameters())
opt = torch.optim.Adam(params.values(), lr=1e-3)

n_inner_iter, inner_lr, K, num_tasks = 1, 1e-2, 10, 16

def sample_tasks(outer_batch_size, inner_batch_size):
    # Select amplitude and phase for the task
    As, phases = [], []
    for _ in range(outer_batch_size):
        As.append(torch.empty(1).uniform_(0.1, 0.5).item())
        phases.append(torch.empty(1).uniform_(0.0, math.pi).item())

    def get_batch():
        xs, ys = [], []
        for A, phase in zip(As, phases):
            x = torch.empty(inner_batch_size, 1).uniform_(-5.0, 5.0)
            y = A * torch.sin(x + phase)
            xs.append(x); ys.append(y)
        return torch.stack(xs), torch.stack(ys)

    x1, y1 = get_batch()
    x2, y2 = get_batch()
    return x1, y1, x2, y2

def inner_loss(new_params, x, y):
    return mse_loss(functional_call(net, new_params, (x,)), y)

def get_loss_for_task(use_transform, x1, y1, x2, y2):
    def inner_adapt(p):
        for _ in range(n_inner_iter):
            grads = grad(inner_loss)(p, x1, y1)
            p = {k: p[k] - inner_lr * grads[k] for k in p}
        return p
    new_params = inner_adapt(params)
    # The final set of adapted parameters will induce some
    # final loss and accuracy on the query dataset.
    return inner_loss(new_params, x2, y2)

losses = []
for it in range(40):
    x1, y1, x2, y2 = sample_tasks(num_tasks, K)
    opt.zero_grad()
    task_losses = vmap(get_loss_for_task, in_dims=(None, 0, 0, 0, 0))(True, x1, y1, x2, y2)
    loss = task_losses.mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if it % 10 == 9:
        print(f"meta-iter {it + 1}: query loss after adaptation {sum(losses[-10:]) / 10:.4f}")

# ---------------------------------------------------------------- meta-test
x1, y1, x2, y2 = sample_tasks(64, K)
with torch.no_grad():
    pre = vmap(lambda a, b: inner_loss(params, a, b))(x2, y2).mean()
post = vmap(get_loss_for_task, in_dims=(None, 0, 0, 0, 0))(True, x1, y1, x2, y2).mean().detach()
print(f"meta-test: query loss before adaptation {pre.item():.4f}, after 1 step {post.item():.4f}")
torch.save({k: v.detach() for k, v in params.items()}, "maml_sine_params.pt")
