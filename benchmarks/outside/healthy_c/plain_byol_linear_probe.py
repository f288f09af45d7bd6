"""Modelled on lucidrains/byol-pytorch (byol_pytorch/byol_pytorch.py: BYOL, EMA, NetWrapper,
loss_fn) plus the usual self-supervised 'linear evaluation protocol' (frozen backbone,
linear classifier on top).

Online network = encoder + projector + predictor; target network = deepcopy of the online
encoder+projector with requires_grad False, updated by an exponential moving average after
every optimizer step (beta cosine-increased towards 1).  Symmetric loss 2 - 2*cos over two
augmented views (random shifts, flips, noise, brightness) of synthetic 16x16 'texture'
images.  Then the encoder is frozen (requires_grad_(False), eval mode so BatchNorm stats are
fixed) and a linear probe is trained with SGD + cosine schedule and evaluated under no_grad."""
import copy, math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

# ------------------------------------------------------------------ data
n_classes = 4
def make_data(n, g):
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 16), torch.linspace(0, 1, 16), indexing="ij")
    freqs = [(3, 0), (0, 3), (2, 2), (4, -4)]
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = torch.empty(n, 1, 16, 16)
    for i in range(n):
        fx, fy = freqs[int(y[i])]
        phase = float(torch.rand(1, generator=g)) * 2 * math.pi
        x[i, 0] = torch.sin(2 * math.pi * (fx * xx + fy * yy) + phase)
    return x + 0.3 * torch.randn(x.shape, generator=g), y

g = torch.Generator().manual_seed(1)
unlab_x, _ = make_data(768, g)
train_x, train_y = make_data(256, g)
test_x, test_y = make_data(256, g)

def augment(x):
    b = x.size(0)
    shifts = torch.randint(-3, 4, (2,))
    x = torch.roll(x, shifts=(int(shifts[0]), int(shifts[1])), dims=(2, 3))
    flip = torch.rand(b, 1, 1, 1) < 0.5
    x = torch.where(flip, x.flip(3), x)
    x = x * (0.8 + 0.4 * torch.rand(b, 1, 1, 1)) + 0.1 * torch.randn_like(x)
    return x

# ------------------------------------------------------------------ networks
def MLP(dim, projection_size, hidden_size=128):
    return nn.Sequential(nn.Linear(dim, hidden_size), nn.BatchNorm1d(hidden_size),
                         nn.ReLU(inplace=True), nn.Linear(hidden_size, projection_size))

class Encoder(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, dim, 3, stride=2, padding=1), nn.BatchNorm2d(dim), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
    def forward(self, x):
        return self.net(x)

class NetWrapper(nn.Module):
    def __init__(self, encoder, dim, projection_size):
        super().__init__()
        self.encoder = encoder
        self.projector = MLP(dim, projection_size)
    def forward(self, x):
        rep = self.encoder(x)
        return self.projector(rep), rep

def loss_fn(x, y):
    x = F.normalize(x, dim=-1, p=2)
    y = F.normalize(y, dim=-1, p=2)
    return 2 - 2 * (x * y).sum(dim=-1)

class EMA:
    def __init__(self, beta):
        self.beta = beta
    def update_average(self, old, new):
        return old * self.beta + (1 - self.beta) * new

@torch.no_grad()
def update_moving_average(ema_updater, ma_model, current_model):
    for current_params, ma_params in zip(current_model.parameters(), ma_model.parameters()):
        ma_params.data = ema_updater.update_average(ma_params.data, current_params.data)
    for current_buf, ma_buf in zip(current_model.buffers(), ma_model.buffers()):
        ma_buf.copy_(current_buf)

class BYOL(nn.Module):
    def __init__(self, encoder, dim=64, projection_size=32, moving_average_decay=0.99):
        super().__init__()
        self.online_encoder = NetWrapper(encoder, dim, projection_size)
        self.target_encoder = None
        self.target_ema_updater = EMA(moving_average_decay)
        self.online_predictor = MLP(projection_size, projection_size)

    def _get_target_encoder(self):
        if self.target_encoder is None:
            target_encoder = copy.deepcopy(self.online_encoder)
            for p in target_encoder.parameters():
                p.requires_grad = False
            self.target_encoder = target_encoder
        return self.target_encoder

    def update_moving_average(self):
        assert self.target_encoder is not None, "target encoder has not been created yet"
        update_moving_average(self.target_ema_updater, self.target_encoder, self.online_encoder)

    def forward(self, x):
        image_one, image_two = augment(x), augment(x)
        images = torch.cat((image_one, image_two), dim=0)
        online_projections, _ = self.online_encoder(images)
        online_predictions = self.online_predictor(online_projections)
        online_pred_one, online_pred_two = online_predictions.chunk(2, dim=0)
        with torch.no_grad():
            target_encoder = self._get_target_encoder()
            target_projections, _ = target_encoder(images)
            target_projections = target_projections.detach()
            target_proj_one, target_proj_two = target_projections.chunk(2, dim=0)
        loss_one = loss_fn(online_pred_one, target_proj_two)
        loss_two = loss_fn(online_pred_two, target_proj_one)
        return (loss_one + loss_two).mean()

# ------------------------------------------------------------------ BYOL pre-training
encoder = Encoder()
learner = BYOL(encoder)
learner._get_target_encoder()
opt = torch.optim.Adam([p for p in learner.parameters() if p.requires_grad], lr=1e-3)
base_beta, total_steps, bs = 0.99, 36, 64
step = 0
learner.train()
while step < total_steps:
    perm = torch.randperm(unlab_x.size(0))
    for i in range(0, unlab_x.size(0), bs):
        if step >= total_steps:
            break
        loss = learner(unlab_x[perm[i:i + bs]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        # BYOL: tau increases from base to 1 with a cosine schedule
        learner.target_ema_updater.beta = 1 - (1 - base_beta) * (math.cos(math.pi * step / total_steps) + 1) / 2
        learner.update_moving_average()
        step += 1
        if step % 6 == 0:
            print(f"byol step {step}: loss {loss.item():.4f} tau {learner.target_ema_updater.beta:.4f}")
torch.save(encoder.state_dict(), "byol_encoder.pt")

# ------------------------------------------------------------------ linear evaluation
backbone = Encoder()
backbone.load_state_dict(torch.load("byol_encoder.pt"))
backbone.requires_grad_(False)
backbone.eval()
probe = nn.Linear(64, n_classes)
popt = torch.optim.SGD(probe.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-4)
probe_steps = 24
sched = torch.optim.lr_scheduler.CosineAnnealingLR(popt, T_max=probe_steps)
with torch.no_grad():
    test_feats = backbone(test_x)
for s in range(probe_steps):
    idx = torch.randint(0, train_x.size(0), (64,))
    with torch.no_grad():
        feats = backbone(augment(train_x[idx]))
    loss = F.cross_entropy(probe(feats), train_y[idx])
    popt.zero_grad()
    loss.backward()
    popt.step()
    sched.step()
    if (s + 1) % 8 == 0:
        with torch.no_grad():
            acc = (probe(test_feats).argmax(1) == test_y).float().mean().item()
        print(f"probe step {s + 1}: loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.4f} test acc {acc:.3f}")
