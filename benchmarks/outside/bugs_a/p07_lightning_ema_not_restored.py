"""p07 - class 4: Lightning, an EMA callback copies the EMA weights into the model for validation and
never restores the raw weights, so training continues from the EMA average (weights overwritten mid-run).
Modelled on: PKU-YuanGroup/Open-Sora-Plan #186 "Missed to restore model weights in training after
validation with EMA on", harubaru/waifu-diffusion PR #31 "Restore non-EMA weights after saving
checkpoint" and atomistic-machine-learning/schnetpack PR #785.  Validation every 12 steps
(val_check_interval=12), 36 steps.  Onset: optimizer step 12 (0-based, right after the first validation).
`--healthy` restores the raw weights in on_validation_end."""
import sys, warnings, torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
warnings.filterwarnings("ignore")
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
class EMA(L.Callback):
    def __init__(s, decay=0.8): s.decay, s.shadow, s.backup = decay, None, None
    def on_train_batch_end(s, trainer, pl_module, *a):
        with torch.no_grad():
            ps = [p.detach().clone() for p in pl_module.parameters()]
            if s.shadow is None: s.shadow = ps
            else:
                for sh, p in zip(s.shadow, ps): sh.mul_(s.decay).add_(p, alpha=1 - s.decay)
    def on_validation_start(s, trainer, pl_module):
        if s.shadow is None: return
        s.backup = [p.detach().clone() for p in pl_module.parameters()]
        with torch.no_grad():
            for p, sh in zip(pl_module.parameters(), s.shadow): p.copy_(sh)   # validate with EMA weights
        if not healthy and trainer.global_step == 12: print("ONSET: training continues from EMA weights at optimizer step 12 (0-based)")
    def on_validation_end(s, trainer, pl_module):
        if healthy and s.backup is not None:
            with torch.no_grad():
                for p, b in zip(pl_module.parameters(), s.backup): p.copy_(b)
class Net(L.LightningModule):
    def __init__(s):
        super().__init__()
        s.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
    def training_step(s, b, i):
        x, y = b; return F.cross_entropy(s.net(x), y)
    def validation_step(s, b, i):
        x, y = b; s.log("val_loss", F.cross_entropy(s.net(x), y))
    def configure_optimizers(s): return torch.optim.SGD(s.parameters(), lr=0.2, momentum=0.9)
g = torch.Generator().manual_seed(1)
X = torch.randn(36 * 32, 16, generator=g); Y = (X[:, :4].argmax(1))
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32)
vdl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:64], Y[:64]), batch_size=32)
tr = L.Trainer(max_steps=36, val_check_interval=12, limit_val_batches=2, num_sanity_val_steps=0,
               enable_checkpointing=False, logger=False, accelerator="cpu", devices=1,
               enable_progress_bar=False, enable_model_summary=False, callbacks=[EMA()])
tr.fit(Net(), dl, vdl)
