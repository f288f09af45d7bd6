"""P02 (class a: precision changed mid-run) -- Lightning automatic optimization.

Modelled on pytorch/pytorch#8860 "NaN loss when using half precision" (user casts the
whole model to .half() and trains in pure fp16) combined with the common
memory-saving recipe of casting a model to fp16 from a callback after warm-up.  From
global step 12 a callback calls pl_module.half() and the batches are cast to fp16, so the
remaining steps run pure fp16 (fp16 master weights and fp16 gradients; SGD momentum buffers stay fp32) instead of fp32.
Healthy twin: the callback does nothing.
"""
import sys, warnings, torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
warnings.filterwarnings("ignore")
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
X = torch.randn(36 * 32, 16); Y = (X[:, :8].sum(1) > 0).long()
class M(L.LightningModule):
    def __init__(s):
        super().__init__(); s.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    def training_step(s, b, i):
        x, y = b
        x = x.to(next(s.parameters()).dtype)
        out = s.net(x); loss = F.cross_entropy(out.float(), y)
        if s.global_step in (11, 12, 35): print(f"step {s.global_step} param dtype={next(s.parameters()).dtype} loss={loss.item():.4f}")
        return loss
    def configure_optimizers(s): return torch.optim.SGD(s.parameters(), lr=0.05, momentum=0.9)
class HalfAfterWarmup(L.Callback):
    def on_train_batch_start(s, trainer, pl_module, batch, batch_idx):
        if not HEALTHY and trainer.global_step == 12 and next(pl_module.parameters()).dtype != torch.float16:
            print("ONSET step", trainer.global_step); pl_module.half()
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32)
tr = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[HalfAfterWarmup()])
tr.fit(M(), dl)
