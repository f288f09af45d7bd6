"""Healthy: lucidrains/byol-pytorch (byol_pytorch.py) -- BYOL two-view self-supervised training: an online
NetWrapper (encoder + MLP projector with BatchNorm1d) plus predictor, a target encoder created lazily by deepcopy on
the first forward (@singleton('target_encoder')) with requires_grad False, the target forward under torch.no_grad()
in training mode, symmetric normalised-MSE loss, and update_moving_average (EMA, beta=0.99) after every
optimizer step (learner.update_moving_average()). Ends with a kNN-free linear-probe-style eval of embeddings."""
import copy, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
def singleton(cache_key):
    def inner_fn(fn):
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None: return instance
            instance = fn(self, *args, **kwargs); setattr(self, cache_key, instance); return instance
        return wrapper
    return inner_fn
def loss_fn(x, y):
    x = F.normalize(x, dim=-1, p=2); y = F.normalize(y, dim=-1, p=2)
    return 2 - 2 * (x * y).sum(dim=-1)
class EMA:
    def __init__(self, beta): self.beta = beta
    def update_average(self, old, new): return old * self.beta + (1 - self.beta) * new
def update_moving_average(ema_updater, ma_model, current_model):
    for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters()):
        ma_params.data = ema_updater.update_average(ma_params.data, current_params.data)
def MLP(dim, projection_size, hidden_size=64):
    return nn.Sequential(nn.Linear(dim, hidden_size), nn.BatchNorm1d(hidden_size), nn.ReLU(inplace=True), nn.Linear(hidden_size, projection_size))
class NetWrapper(nn.Module):
    def __init__(self, net, projection_size, dim):
        super().__init__(); self.net = net; self.projector = MLP(dim, projection_size)
    def forward(self, x, return_projection=True):
        rep = self.net(x)
        return (self.projector(rep), rep) if return_projection else rep
class BYOL(nn.Module):
    def __init__(self, net, dim, projection_size=32, moving_average_decay=0.99):
        super().__init__()
        self.online_encoder = NetWrapper(net, projection_size, dim)
        self.target_encoder = None
        self.target_ema_updater = EMA(moving_average_decay)
        self.online_predictor = MLP(projection_size, projection_size)
    @singleton('target_encoder')
    def _get_target_encoder(self):
        target_encoder = copy.deepcopy(self.online_encoder)
        for p in target_encoder.parameters(): p.requires_grad = False
        return target_encoder
    def update_moving_average(self):
        update_moving_average(self.target_ema_updater, self.target_encoder, self.online_encoder)
    def augment(self, x):
        x = x + 0.1 * torch.randn_like(x)
        flip = torch.rand(x.size(0)) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x * (0.8 + 0.4 * torch.rand(x.size(0), 1, 1, 1))
    def forward(self, x, return_embedding=False):
        if return_embedding: return self.online_encoder(x, return_projection=False)
        image_one, image_two = self.augment(x), self.augment(x)
        images = torch.cat((image_one, image_two), dim=0)
        online_projections, _ = self.online_encoder(images)
        online_predictions = self.online_predictor(online_projections)
        online_pred_one, online_pred_two = online_predictions.chunk(2, dim=0)
        with torch.no_grad():
            target_encoder = self._get_target_encoder()
            target_projections, _ = target_encoder(images)
            target_projections = target_projections.detach()
            target_proj_one, target_proj_two = target_projections.chunk(2, dim=0)
        loss = loss_fn(online_pred_one, target_proj_two.detach()) + loss_fn(online_pred_two, target_proj_one.detach())
        return loss.mean()
resnet = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
learner = BYOL(resnet, dim=32)
opt = torch.optim.Adam(learner.parameters(), lr=3e-4)
def sample_unlabelled_images(n=32):
    cls = torch.randint(0, 4, (n,)); g = torch.linspace(-1, 1, 16)
    phase = torch.rand(n, 3, 1, 1) * 6
    return torch.sin((cls[:, None, None, None] + 1) * 3 * g[None, None, :, None] + phase + 0 * g[None, None, None, :]), cls
for step in range(30):
    images, _ = sample_unlabelled_images()
    loss = learner(images)
    opt.zero_grad(); loss.backward(); opt.step()
    learner.update_moving_average()
    if step % 10 == 9:
        learner.eval()
        with torch.no_grad():
            xs, ys = sample_unlabelled_images(64); emb = F.normalize(learner(xs, return_embedding=True), dim=-1)
            sim = emb @ emb.t(); sim.fill_diagonal_(-2)
            acc = (ys[sim.argmax(1)] == ys).float().mean().item()
        learner.train(); print(f"step {step} loss {loss.item():.3f} 1-NN acc {acc:.2f}")
