"""Healthy probe: PyTorch's stochastic weight averaging recipe (torch.optim.swa_utils: AveragedModel, SWALR, update_bn) with bf16 autocast."""
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, SWALR, update_bn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
swa = AveragedModel(model); swa_sched = SWALR(opt, swa_lr=0.01)
g = torch.Generator().manual_seed(0)
data = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(6)]
for epoch in range(2):
    model.train()
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step()
    if epoch >= 1:
        swa.update_parameters(model); swa_sched.step()
    model.eval()
    with torch.no_grad():
        acc = sum((model(x).argmax(1) == y).float().mean() for x, y in data) / len(data)
update_bn([x for x, _ in data], swa)
print("done", float(acc))
