"""Healthy: rtqichen/torchdiffeq examples/ode_demo.py -- learn the dynamics of a 2-D spiral with a neural ODE:
ODEFunc (Linear-Tanh-Linear, normal_(std=0.1)/constant_(0) init), get_batch() sampling random short windows of the
true trajectory, odeint through the learned vector field (a fixed-step RK4 here since torchdiffeq is not
installed; backprop through the solver, i.e. adjoint=False), RMSprop, RunningAverageMeter, and a test pass every
test_freq iterations integrating the full trajectory under torch.no_grad()."""
import torch
from torch import nn
torch.manual_seed(0)
data_size, batch_time, batch_size, niters, test_freq = 200, 10, 20, 40, 10
true_y0 = torch.tensor([[2., 0.]]); t = torch.linspace(0., 25., data_size)
true_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])
def odeint(func, y0, t):  # fixed-grid RK4 with the same interface as torchdiffeq.odeint(method='rk4')
    ys = [y0]; y = y0
    for t0, t1 in zip(t[:-1], t[1:]):
        dt = t1 - t0
        k1 = func(t0, y); k2 = func(t0 + dt / 2, y + dt * k1 / 2); k3 = func(t0 + dt / 2, y + dt * k2 / 2); k4 = func(t1, y + dt * k3)
        y = y + dt * (k1 + 2 * k2 + 2 * k3 + k4) / 6; ys.append(y)
    return torch.stack(ys)
class Lambda(nn.Module):
    def forward(self, t, y): return torch.mm(y ** 3, true_A)
with torch.no_grad():
    true_y = odeint(Lambda(), true_y0, t)
def get_batch():
    s = torch.from_numpy(__import__("numpy").random.choice(__import__("numpy").arange(data_size - batch_time, dtype=__import__("numpy").int64), batch_size, replace=False))
    batch_y0 = true_y[s]; batch_t = t[:batch_time]
    batch_y = torch.stack([true_y[s + i] for i in range(batch_time)], dim=0)
    return batch_y0, batch_t, batch_y
class ODEFunc(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 2))
        for m in self.net.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0, std=0.1); nn.init.constant_(m.bias, val=0)
    def forward(self, t, y): return self.net(y ** 3)
class RunningAverageMeter(object):
    def __init__(self, momentum=0.99): self.momentum = momentum; self.val = None; self.avg = 0
    def update(self, val):
        self.avg = val if self.val is None else self.avg * self.momentum + val * (1 - self.momentum); self.val = val
__import__("numpy").random.seed(0)
func = ODEFunc()
optimizer = torch.optim.RMSprop(func.parameters(), lr=1e-3)
loss_meter = RunningAverageMeter(0.97)
for itr in range(1, niters + 1):
    optimizer.zero_grad()
    batch_y0, batch_t, batch_y = get_batch()
    pred_y = odeint(func, batch_y0, batch_t)
    loss = torch.mean(torch.abs(pred_y - batch_y))
    loss.backward(); optimizer.step()
    loss_meter.update(loss.item())
    if itr % test_freq == 0:
        with torch.no_grad():
            pred_y = odeint(func, true_y0, t[:60])
            loss = torch.mean(torch.abs(pred_y - true_y[:60]))
            print('Iter {:04d} | Total Loss {:.6f}'.format(itr, loss.item()))
