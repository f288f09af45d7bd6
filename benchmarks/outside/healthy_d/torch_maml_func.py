"""Modelled on pytorch/functorch examples/maml_regression/evjang_transforms.py (MAML on
sinusoid regression, Finn et al. 2017), ported to torch.func.

Exercises meta-learning with torch.func: the inner loop adapts a *copy* of the parameters
functionally (torch.func.grad + functional_call, create_graph via composable transforms),
tasks are batched with torch.func.vmap, and only the outer loop uses torch.optim.Adam on the
module's real parameters. The inner-loop "updates" never touch nn.Parameters in place.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

torch.set_num_threads(1)
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1, 40)
        self.fc2 = nn.Linear(40, 40)
        self.fc3 = nn.Linear(40, 1)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
inner_lr, n_inner, K, n_tasks = 1e-2, 1, 10, 8


def mse_loss(params, x, y):
    return F.mse_loss(functional_call(net, params, (x,)), y)


def get_loss_for_task(x1, y1, x2, y2, params):
    # adaptation on the support set (the grads are differentiable -> second-order MAML)
    new_params = dict(params)
    for _ in range(n_inner):
        grads = grad(mse_loss)(new_params, x1, y1)
        new_params = {k: new_params[k] - inner_lr * grads[k] for k in new_params}
    # evaluate adapted params on the query set
    return mse_loss(new_params, x2, y2)


def sample_tasks(outer_batch_size, inner_batch_size):
    As = torch.empty(outer_batch_size).uniform_(0.1, 0.5)
    phases = torch.empty(outer_batch_size).uniform_(0.0, math.pi)

    def draw():
        x = torch.empty(outer_batch_size, inner_batch_size, 1).uniform_(-5, 5)
        y = As.view(-1, 1, 1) * torch.sin(x + phases.view(-1, 1, 1))
        return x, y

    x1, y1 = draw()
    x2, y2 = draw()
    return x1, y1, x2, y2


for it in range(50):
    x1, y1, x2, y2 = sample_tasks(n_tasks, K)
    params = dict(net.named_parameters())
    task_losses = vmap(get_loss_for_task, in_dims=(0, 0, 0, 0, None))(x1, y1, x2, y2, params)
    loss = task_losses.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 10 == 0:
        print(f"iter {it:3d} meta-loss {loss.item():.4f}")

# meta-test: adapt to a fresh task with a few plain gradient steps on a copy of the weights
x1, y1, x2, y2 = sample_tasks(1, K)
params = {k: v.detach() for k, v in net.named_parameters()}
before = mse_loss(params, x2[0], y2[0]).item()
for _ in range(5):
    g = grad(mse_loss)(params, x1[0], y1[0])
    params = {k: params[k] - inner_lr * g[k] for k in params}
print(f"meta-test query loss before {before:.4f} after 5 steps {mse_loss(params, x2[0], y2[0]).item():.4f}")
