"""Physics-informed neural network: data-driven discovery of Burgers' equation (Adam, then L-BFGS).

Modelled on: maziarraissi/PINNs ``appendix/continuous_time_identification (Burgers)`` (Raissi,
Perdikaris & Karniadakis, J. Comput. Phys. 2019) in the widely used PyTorch port
jayroxis/PINNs ``Burgers Equation/Burgers Identification (PyTorch).ipynb``: a tanh MLP
``DNN`` for u(x, t), unknown PDE coefficients ``lambda_1`` and ``lambda_2`` (the latter in log
space, initialised at -6) registered as extra parameters of the network, ``net_f`` computing the
residual ``u_t + lambda_1 u u_x - exp(lambda_2) u_xx`` with ``torch.autograd.grad(...,
create_graph=True)``, a first phase with ``optimizer_Adam`` and a second phase with
``torch.optim.LBFGS(..., line_search_fn="strong_wolfe")`` driven by the ``loss_func`` closure.
Training data come from the exact Cole-Hopf solution
u = 2 nu pi e^{-pi^2 nu t} sin(pi x) / (2 + e^{-pi^2 nu t} cos(pi x)) with nu = 0.1, plus 1% noise.

Unusual (but intended) things about the loop:
* the loss contains first and second derivatives of the network w.r.t. its *inputs*, so each
  backward is a double backward through a graph built with ``create_graph=True``;
* two scalar physical coefficients are trained jointly with the weights (one in log space)
  and are the quantity of interest, not the loss;
* the optimizer is switched mid-run (40 Adam steps, then one L-BFGS ``step(closure)`` that runs
  up to 30 iterations and calls the closure - forward + backward - several times per
  iteration, with line-search evaluations whose loss can temporarily increase).
"""
from collections import OrderedDict

import numpy as np
import torch

torch.set_num_threads(1)
np.random.seed(1234)
torch.manual_seed(1234)


class DNN(torch.nn.Module):
    def __init__(self, layers, lb, ub):
        super().__init__()
        self.depth = len(layers) - 1
        self.activation = torch.nn.Tanh
        layer_list = []
        for i in range(self.depth - 1):
            layer_list.append((f"layer_{i}", torch.nn.Linear(layers[i], layers[i + 1])))
            layer_list.append((f"activation_{i}", self.activation()))
        layer_list.append((f"layer_{self.depth - 1}", torch.nn.Linear(layers[-2], layers[-1])))
        self.layers = torch.nn.Sequential(OrderedDict(layer_list))
        self.register_buffer("lb", torch.tensor(lb, dtype=torch.float32))
        self.register_buffer("ub", torch.tensor(ub, dtype=torch.float32))

    def forward(self, x):
        return self.layers(2.0 * (x - self.lb) / (self.ub - self.lb) - 1.0)


class PhysicsInformedNN:
    def __init__(self, X, u, layers, lb, ub, lbfgs_iters=30):
        self.x = torch.tensor(X[:, 0:1], requires_grad=True).float()
        self.t = torch.tensor(X[:, 1:2], requires_grad=True).float()
        self.u = torch.tensor(u).float()
        self.lambda_1 = torch.nn.Parameter(torch.tensor([0.0]))
        self.lambda_2 = torch.nn.Parameter(torch.tensor([-6.0]))
        self.dnn = DNN(layers, lb, ub)
        self.dnn.register_parameter("lambda_1", self.lambda_1)
        self.dnn.register_parameter("lambda_2", self.lambda_2)
        self.optimizer = torch.optim.LBFGS(self.dnn.parameters(), lr=1.0, max_iter=lbfgs_iters,
                                           max_eval=int(lbfgs_iters * 1.25), history_size=50,
                                           tolerance_grad=1e-5, tolerance_change=1.0 * np.finfo(float).eps,
                                           line_search_fn="strong_wolfe")
        self.optimizer_Adam = torch.optim.Adam(self.dnn.parameters(), lr=3e-3)
        self.iter = 0

    def net_u(self, x, t):
        return self.dnn(torch.cat([x, t], dim=1))

    def net_f(self, x, t):
        lambda_1 = self.lambda_1
        lambda_2 = torch.exp(self.lambda_2)
        u = self.net_u(x, t)
        u_t = torch.autograd.grad(u, t, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]
        u_x = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), retain_graph=True, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x), retain_graph=True, create_graph=True)[0]
        return u_t + lambda_1 * u * u_x - lambda_2 * u_xx

    def loss_terms(self):
        u_pred = self.net_u(self.x, self.t)
        f_pred = self.net_f(self.x, self.t)
        return torch.mean((self.u - u_pred) ** 2), torch.mean(f_pred ** 2)

    def loss_func(self):
        loss_u, loss_f = self.loss_terms()
        loss = loss_u + loss_f
        self.optimizer.zero_grad()
        loss.backward()
        self.iter += 1
        if self.iter % 10 == 0:
            print(f"  L-BFGS closure call {self.iter:3d}: loss {loss.item():.3e}  "
                  f"l1 {self.lambda_1.item():.4f}  l2 {torch.exp(self.lambda_2).item():.5f}")
        return loss

    def train(self, nIter):
        self.dnn.train()
        for it in range(nIter):
            loss_u, loss_f = self.loss_terms()
            loss = loss_u + loss_f
            self.optimizer_Adam.zero_grad()
            loss.backward()
            self.optimizer_Adam.step()
            if it % 10 == 0 or it == nIter - 1:
                print(f"Adam it {it:3d}: loss {loss.item():.3e} (data {loss_u.item():.2e}, pde {loss_f.item():.2e})  "
                      f"l1 {self.lambda_1.item():.4f}  l2 {torch.exp(self.lambda_2).item():.5f}")
        print("switching to L-BFGS")
        self.optimizer.step(self.loss_func)
        state = self.optimizer.state[next(iter(self.dnn.parameters()))]  # L-BFGS keeps its state on the first param
        print(f"L-BFGS: {state['n_iter']} iterations, {state['func_evals']} closure evaluations")

    def predict(self, X):
        x = torch.tensor(X[:, 0:1], requires_grad=True).float()
        t = torch.tensor(X[:, 1:2], requires_grad=True).float()
        self.dnn.eval()
        u = self.net_u(x, t)
        f = self.net_f(x, t)
        return u.detach().numpy(), f.detach().numpy()


def exact_burgers(x, t, nu=0.1, a=2.0):
    decay = np.exp(-np.pi ** 2 * nu * t)
    return 2 * nu * np.pi * decay * np.sin(np.pi * x) / (a + decay * np.cos(np.pi * x))


def main():
    nu, N_u = 0.1, 800
    layers = [2, 20, 20, 20, 20, 1]
    x = np.linspace(-1, 1, 128)
    t = np.linspace(0, 1, 50)
    X, T = np.meshgrid(x, t)
    X_star = np.hstack((X.flatten()[:, None], T.flatten()[:, None])).astype(np.float32)
    u_star = exact_burgers(X_star[:, 0:1], X_star[:, 1:2], nu).astype(np.float32)
    lb, ub = X_star.min(0), X_star.max(0)

    idx = np.random.choice(X_star.shape[0], N_u, replace=False)
    X_u_train, u_train = X_star[idx, :], u_star[idx, :]
    noise = 0.01
    u_train = u_train + noise * np.std(u_train) * np.random.randn(*u_train.shape).astype(np.float32)

    model = PhysicsInformedNN(X_u_train, u_train, layers, lb, ub, lbfgs_iters=30)
    model.train(40)

    u_pred, _ = model.predict(X_star)
    error_u = np.linalg.norm(u_star - u_pred, 2) / np.linalg.norm(u_star, 2)
    lambda_1_value = model.lambda_1.item()
    lambda_2_value = np.exp(model.lambda_2.item())
    print(f"Error u: {error_u:.3e}")
    print(f"Error l1: {100 * abs(lambda_1_value - 1.0):.2f}%   Error l2: {100 * abs(lambda_2_value - nu) / nu:.2f}%")


if __name__ == "__main__":
    main()
