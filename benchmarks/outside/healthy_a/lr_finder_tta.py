"""Healthy: davidtvs/pytorch-lr-finder (LRFinder.range_test with an ExponentialLR-style schedule, the model and
optimizer state cached in memory by StateCacher and put back by lr_finder.reset() via load_state_dict, the learning
rate picked as fastai's lr_min: the minimum of the smoothed loss / 10), then the real training run restarted from those restored
weights with OneCycleLR (max_lr = suggested lr) and evaluated with test-time augmentation in the style of
qubvel/ttach (ClassificationTTAWrapper: identity + horizontal flip + two shifts, merge_mode="mean" of softmax)."""
import copy, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
def data(n):
    x = torch.randn(n, 3, 16, 16); x[:, :2] += 0.3 * torch.randn(n, 2, 1, 1); y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    return x, y
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Dropout(0.2), nn.Linear(32, 4))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.9, weight_decay=5e-4)
class LRFinder:
    def __init__(self, model, optimizer, criterion):
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self.state_cacher = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}
    def reset(self):
        self.model.load_state_dict(self.state_cacher["model"]); self.optimizer.load_state_dict(self.state_cacher["optimizer"])
    def range_test(self, start_lr=1e-4, end_lr=10.0, num_iter=30, smooth_f=0.05, diverge_th=5):
        self.history = {"lr": [], "loss": []}; best_loss = None
        gamma = (end_lr / start_lr) ** (1 / (num_iter - 1))
        for g in self.optimizer.param_groups: g["lr"] = start_lr
        self.model.train()
        for it in range(num_iter):
            x, y = data(32)
            self.optimizer.zero_grad(); loss = self.criterion(self.model(x), y); loss.backward(); self.optimizer.step()
            lr = self.optimizer.param_groups[0]["lr"]; l = loss.item()
            if it > 0: l = smooth_f * l + (1 - smooth_f) * self.history["loss"][-1]
            self.history["lr"].append(lr); self.history["loss"].append(l)
            best_loss = l if best_loss is None or l < best_loss else best_loss
            if l > diverge_th * best_loss: break
            for g in self.optimizer.param_groups: g["lr"] = lr * gamma
    def suggestion(self):  # fastai's lr_min: the lr at the minimum smoothed loss, divided by 10
        return self.history["lr"][int(torch.tensor(self.history["loss"]).argmin())] / 10
lr_finder = LRFinder(model, optimizer, criterion)
lr_finder.range_test()
lr = lr_finder.suggestion(); print(f"suggested lr {lr:.4g}")
lr_finder.reset()
steps = 40
for g in optimizer.param_groups: g["lr"] = lr
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
class ClassificationTTAWrapper(nn.Module):
    def __init__(self, model):
        super().__init__(); self.model = model
        self.transforms = [lambda x: x, lambda x: x.flip(-1), lambda x: torch.roll(x, 1, -1), lambda x: torch.roll(x, -1, -2)]
    def forward(self, x):
        return torch.stack([self.model(t(x)).softmax(-1) for t in self.transforms]).mean(0)
for step in range(steps):
    model.train()
    x, y = data(32)
    optimizer.zero_grad(); loss = criterion(model(x), y); loss.backward(); optimizer.step(); scheduler.step()
tta = ClassificationTTAWrapper(model); model.eval()
with torch.no_grad():
    x, y = data(256)
    plain = (model(x).argmax(1) == y).float().mean().item()
    probs = tta(x)
    print(f"loss {loss.item():.3f} acc {plain:.3f} tta acc {(probs.argmax(1) == y).float().mean().item():.3f} tta nll {F.nll_loss(probs.log(), y).item():.3f}")
