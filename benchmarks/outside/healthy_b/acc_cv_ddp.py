"""Modelled on huggingface/accelerate examples/cv_example.py (image classifier, OneCycleLR,
accelerator.prepare, eval with gather_for_metrics) with examples/by_feature/checkpointing.py
(accelerator.save_state each epoch) and accelerator.clip_grad_norm_; launched as 2 CPU
processes (gloo) with torchrun. A small CNN stands in for timm's resnet50d; synthetic 16x16 images."""
import os, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
def make(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g); x = torch.randn(n, 3, 16, 16, generator=g)
    x[:, :, :8, :8] += (y == 0).float()[:, None, None, None]; x[:, :, 8:, :8] += (y == 1).float()[:, None, None, None]
    x[:, :, :8, 8:] += (y == 2).float()[:, None, None, None]; x[:, :, 8:, 8:] += (y == 3).float()[:, None, None, None]
    return TensorDataset(x, y)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, 4))
    def forward(self, x): return self.classifier(self.features(x))
def main():
    set_seed(0)
    accelerator = Accelerator(cpu=True, project_dir="out/acc_cv")
    train_dl = DataLoader(make(640, 0), batch_size=16, shuffle=True)
    eval_dl = DataLoader(make(128, 1), batch_size=32)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3 / 25)
    lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, epochs=2,
        steps_per_epoch=len(train_dl) // accelerator.num_processes)
    model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, lr_scheduler)
    for epoch in range(2):
        model.train()
        for x, y in train_dl:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 2.0)
            optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()
        model.eval(); acc = []
        for x, y in eval_dl:
            with torch.no_grad(): out = model(x)
            p, r = accelerator.gather_for_metrics((out.argmax(-1), y)); acc.append((p == r).float())
        accelerator.print(f"epoch {epoch} acc {torch.cat(acc).mean():.3f}")
        accelerator.save_state(os.path.join("out/acc_cv", f"epoch_{epoch}"))
    accelerator.end_training()
if __name__ == "__main__":
    main()
