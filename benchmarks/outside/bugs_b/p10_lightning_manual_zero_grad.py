"""P10 (class f: zero_grad missing mid-run) -- Lightning manual optimization.

Modelled on Lightning-AI/pytorch-lightning#6282 "GAN Manual Optimization not working for
1.2.0 through master" (manual-optimization training breaks depending on where
opt.zero_grad() is placed) and #12811 "manual_backward" (zero_grad/step placement in the
documented manual-optimization example).  In epoch 0 the step zeroes grads each batch;
from epoch 1 the code path for "stage 2" moves zero_grad to on_train_epoch_start, so
within an epoch gradients accumulate across optimizer steps.  Batch 0 of epoch 1 (step 12)
still starts from zeroed grads; the first buggy step is global step 13.
Healthy twin: zero_grad every batch in every epoch.
"""
import sys, warnings, torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
warnings.filterwarnings("ignore")
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
X = torch.randn(12 * 32, 10); Y = X @ torch.randn(10, 1) + 0.1 * torch.randn(12 * 32, 1)
class M(L.LightningModule):
    def __init__(s):
        super().__init__(); s.automatic_optimization = False
        s.net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    def on_train_epoch_start(s):
        if s.current_epoch >= 1 and not HEALTHY: s.optimizers().zero_grad()
    def training_step(s, b, i):
        opt = s.optimizers(); x, y = b
        if HEALTHY or s.current_epoch == 0: opt.zero_grad()
        loss = F.mse_loss(s.net(x), y)
        s.manual_backward(loss)
        gstep = s.current_epoch * 12 + i
        if gstep == 13 and not HEALTHY: print("ONSET step", gstep)
        if gstep in (12, 13, 35): print(f"step {gstep} grad-norm={torch.cat([p.grad.flatten() for p in s.parameters()]).norm():.3f} loss={loss.item():.4f}")
        opt.step()
    def configure_optimizers(s): return torch.optim.SGD(s.parameters(), lr=0.05)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32)
L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(M(), dl)
