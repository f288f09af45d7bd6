"""Healthy probe: sharpness-aware minimisation (davda54/sam's SAM wrapper: first_step perturbs, second_step restores and steps the base optimizer)."""
import torch
from torch import nn
class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        defaults = dict(rho=rho, **kwargs)
        super().__init__(params, defaults)
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for g in self.param_groups for p in g["params"] if p.grad is not None]), p=2)
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None: continue
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * scale.to(p))
        if zero_grad: self.zero_grad()
    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None: continue
                p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad: self.zero_grad()
    def step(self, closure=None):
        raise NotImplementedError
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
opt = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
for step in range(10):
    x = torch.randn(16, 10); y = torch.randint(0, 3, (16,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.first_step(zero_grad=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.second_step(zero_grad=True)
print("done")
