"""Healthy probe: Hugging Face Accelerate gradient-accumulation guide: accumulate(), sync_gradients, clip_grad_norm_, bf16."""
import torch
from torch import nn
from accelerate import Accelerator
acc = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16", cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 6, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ds = torch.utils.data.TensorDataset(torch.randint(0, 50, (96, 6)), torch.randint(0, 2, (96,)))
dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=6)
model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
model.train()
for x, y in dl:
    with acc.accumulate(model):
        loss = nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        if acc.sync_gradients:
            acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step(); opt.zero_grad()
print("done")
