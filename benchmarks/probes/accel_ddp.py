"""Healthy probe: Hugging Face Accelerate on two processes: prepare(), backward(), gather_for_metrics in evaluation, a main-process save."""
import os
import tempfile
import torch
from torch import nn
from accelerate import Accelerator
acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ds = torch.utils.data.TensorDataset(torch.randn(128, 12), torch.randint(0, 3, (128,)))
dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
model, opt, dl = acc.prepare(model, opt, dl)
for epoch in range(1):
    model.train()
    for x, y in dl:
        opt.zero_grad(); acc.backward(nn.functional.cross_entropy(model(x), y)); opt.step()
    model.eval()
    with torch.no_grad():
        preds = acc.gather_for_metrics(model(torch.randn(8, 12)).argmax(1))
    if acc.is_main_process:
        acc.save(acc.unwrap_model(model).state_dict(), os.path.join(tempfile.mkdtemp(), "accel.pt"))
acc.wait_for_everyone()
print("done")
