"""Healthy: multi-task learning with homoscedastic-uncertainty loss weighting (Kendall, Gal & Cipolla, CVPR 2018),
in the form of the widely copied `AutomaticWeightedLoss` module (learnable log-variances s_i, loss =
sum_i exp(-s_i) * L_i + s_i, its parameters given to the optimizer in their own param group with no weight decay):
a shared conv encoder with BatchNorm feeding a per-pixel segmentation head and a depth-regression head, both
computed on every batch; Adam; validation every 10 steps; the best state_dict (lowest val loss) is kept in memory
with copy.deepcopy and restored with load_state_dict at the end (Keras-style restore_best_weights)."""
import copy, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
class AutomaticWeightedLoss(nn.Module):
    def __init__(self, num=2):
        super().__init__(); self.params = nn.Parameter(torch.zeros(num))
    def forward(self, *losses):
        return sum(torch.exp(-self.params[i]) * l + self.params[i] for i, l in enumerate(losses))
class MTLNet(nn.Module):
    def __init__(self, c=16, n_cls=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                     nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.heads = nn.ModuleDict({"seg": nn.Conv2d(c, n_cls, 1), "depth": nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, 1, 1))})
    def forward(self, x):
        h = self.encoder(x); return {t: head(h) for t, head in self.heads.items()}
def data(n):
    x = torch.randn(n, 3, 16, 16)
    seg = x[:, :3].argmax(1); depth = x.mean(1, keepdim=True).tanh()
    return x, seg, depth
model, awl = MTLNet(), AutomaticWeightedLoss(2)
opt = torch.optim.Adam([{"params": model.parameters(), "weight_decay": 1e-4}, {"params": awl.parameters(), "weight_decay": 0}], lr=3e-3)
best, best_state = float("inf"), None
for step in range(40):
    model.train()
    x, seg, depth = data(16)
    out = model(x)
    l_seg = F.cross_entropy(out["seg"], seg); l_depth = F.l1_loss(out["depth"], depth)
    loss = awl(l_seg, l_depth)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            x, seg, depth = data(64); out = model(x)
            val = F.cross_entropy(out["seg"], seg).item() + F.l1_loss(out["depth"], depth).item()
        print(f"step {step} loss {loss.item():.3f} val {val:.3f} weights {torch.exp(-awl.params).tolist()}")
        if val < best:
            best, best_state = val, copy.deepcopy(model.state_dict())
model.load_state_dict(best_state)
model.eval()
with torch.no_grad():
    x, seg, depth = data(64); out = model(x)
    print("restored best", best, "test seg acc", (out["seg"].argmax(1) == seg).float().mean().item())
