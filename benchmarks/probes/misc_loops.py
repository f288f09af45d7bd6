"""Healthy probe: a loop with two backward calls per step (retain_graph), a skipped optimizer step, ReduceLROnPlateau, persistent DataLoader workers."""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
aux = nn.Linear(32, 3)
opt = torch.optim.RMSprop(list(model.parameters()) + list(aux.parameters()), lr=1e-3)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1)
ds = torch.utils.data.TensorDataset(torch.randn(128, 10), torch.randn(128, 1), torch.randint(0, 3, (128,)))
dl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
for epoch in range(2):
    for i, (x, y, c) in enumerate(dl):
        opt.zero_grad()
        h = model[1](model[0](x))
        loss_main = nn.functional.mse_loss(model[2](h), y)
        loss_aux = nn.functional.cross_entropy(aux(h), c)
        loss_main.backward(retain_graph=True)   # two backward calls, one step
        (0.1 * loss_aux).backward()
        if i == 3:
            continue                            # a skipped step (e.g. non-finite loss guard)
        opt.step()
    sched.step(loss_main.item())
print("done")
