"""Healthy: maziarraissi/PINNs continuous-time inference for Burgers' equation (appendix/continuous_time_inference
(Burgers)), in the common PyTorch port style: a tanh MLP with Xavier-normal init and input normalisation,
u_t, u_x, u_xx from torch.autograd.grad(..., create_graph=True), MSE on initial/boundary data + PDE residual on
collocation points, Adam warm-up followed by L-BFGS (closure) as in the PINN literature, and an evaluation of
the relative L2 error of u on a test grid (no_grad) plus the residual (with grad)."""
import math, torch
from torch import nn
torch.manual_seed(0)
nu = 0.01 / math.pi
class PhysicsInformedNN(nn.Module):
    def __init__(self, layers):
        super().__init__()
        mods = []
        for i in range(len(layers) - 1):
            lin = nn.Linear(layers[i], layers[i + 1]); nn.init.xavier_normal_(lin.weight); nn.init.zeros_(lin.bias)
            mods += [lin, nn.Tanh()]
        self.net = nn.Sequential(*mods[:-1])
        self.register_buffer("lb", torch.tensor([-1.0, 0.0])); self.register_buffer("ub", torch.tensor([1.0, 1.0]))
    def forward(self, x, t):
        X = torch.cat([x, t], 1); H = 2.0 * (X - self.lb) / (self.ub - self.lb) - 1.0
        return self.net(H)
    def net_f(self, x, t):
        u = self(x, t)
        u_t = torch.autograd.grad(u, t, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]
        u_x = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x), retain_graph=True, create_graph=True)[0]
        return u_t + u * u_x - nu * u_xx
N_u, N_f = 100, 500
x0 = torch.rand(N_u // 2, 1) * 2 - 1; t0 = torch.zeros_like(x0); u0 = -torch.sin(math.pi * x0)
tb = torch.rand(N_u // 2, 1); xb = torch.where(torch.rand(N_u // 2, 1) < 0.5, -1.0, 1.0); ub = torch.zeros_like(tb)
x_u, t_u, u_data = torch.cat([x0, xb]), torch.cat([t0, tb]), torch.cat([u0, ub])
x_f = (torch.rand(N_f, 1) * 2 - 1).requires_grad_(True); t_f = torch.rand(N_f, 1).requires_grad_(True)
model = PhysicsInformedNN([2, 20, 20, 20, 1])
def loss_func():
    u_pred = model(x_u, t_u); f_pred = model.net_f(x_f, t_f)
    return torch.mean((u_data - u_pred) ** 2) + torch.mean(f_pred ** 2)
def evaluate(tag):
    model.eval()
    xs = torch.linspace(-1, 1, 41)[:, None]; ts = torch.zeros_like(xs)
    with torch.no_grad():
        err = torch.linalg.norm(model(xs, ts) + torch.sin(math.pi * xs)) / torch.linalg.norm(torch.sin(math.pi * xs))
    xr = xs.clone().requires_grad_(True); tr = torch.full_like(xs, 0.5).requires_grad_(True)
    res = model.net_f(xr, tr).pow(2).mean().item()
    model.train(); print(f"{tag}: rel L2 at t=0 {err.item():.3f}, residual {res:.4f}")
adam = torch.optim.Adam(model.parameters(), lr=1e-3)
for it in range(40):
    adam.zero_grad(); loss = loss_func(); loss.backward(); adam.step()
    if it % 20 == 19: evaluate(f"adam {it}")
lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=10, history_size=20, tolerance_grad=1e-7,
                          tolerance_change=1e-9, line_search_fn="strong_wolfe")
def closure():
    lbfgs.zero_grad(); loss = loss_func(); loss.backward(); return loss
for it in range(3):
    lbfgs.step(closure)
evaluate("lbfgs")
