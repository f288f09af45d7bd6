"""Healthy probe: PyTorch's tensor-parallel tutorial: parallelize_module with ColwiseParallel/RowwiseParallel on a 1-D device mesh (gloo, two ranks)."""
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
class MLP(nn.Module):
    def __init__(self):
        super().__init__(); self.up = nn.Linear(16, 64); self.down = nn.Linear(64, 16); self.head = nn.Linear(16, 2)
    def forward(self, x): return self.head(torch.relu(self.down(torch.relu(self.up(x)))))
model = MLP()
parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(0)
for step in range(6):
    x = torch.randn(8, 16, generator=g); y = torch.randint(0, 2, (8,), generator=g)
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
dist.barrier(); dist.destroy_process_group(); print("done")
