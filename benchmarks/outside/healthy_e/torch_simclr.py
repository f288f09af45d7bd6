"""SimCLR contrastive pre-training followed by a linear-probe evaluation, on synthetic images.

Modelled on the SimCLR reference recipe (Chen et al., 2020) as implemented in
the popular ``sthalles/SimCLR`` PyTorch repository (``simclr.py``: the
``info_nce_loss`` that builds the 2N x 2N similarity matrix, masks the diagonal
and uses cross-entropy with the positive pair as the target class; temperature
0.2 here instead of the repository's 0.07), with a small conv encoder (in
place of ResNet-18) + 2-layer projection head,
two random augmentations of every image per batch, Adam with weight decay and
a cosine-annealing LR schedule stepped per iteration.

After pre-training, the projection head is discarded, the encoder is frozen and
used in ``eval()`` mode under ``torch.no_grad()`` to extract features, and a
logistic-regression probe is fitted on them (the standard linear evaluation
protocol).  Images are synthetic 16x16 textures from 4 classes (oriented
stripes); augmentations are random crops-with-resize via shifting, flips,
brightness jitter and Gaussian noise.  50 pre-training steps + 30 probe steps.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
parser.add_argument("--temperature", type=float, default=0.2)
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(7)


def make_textures(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    angles = y.float() * (torch.pi / 4) + torch.randn(n, generator=g) * 0.1
    freq = 0.8 + torch.rand(n, generator=g) * 0.4
    phase = torch.rand(n, generator=g) * 6.28
    proj = xx[None] * torch.cos(angles)[:, None, None] + yy[None] * torch.sin(angles)[:, None, None]
    x = torch.sin(proj * freq[:, None, None] + phase[:, None, None])
    x = x + 0.3 * torch.randn(n, 16, 16, generator=g)
    return x.unsqueeze(1), y


def augment(x):
    """Random shift (crop), horizontal flip, brightness/contrast jitter, noise."""
    n = x.size(0)
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    dy, dx = torch.randint(0, 5, (2,)).tolist()
    out = padded[:, :, dy:dy + 16, dx:dx + 16]
    flip = torch.rand(n) < 0.5
    out = torch.where(flip[:, None, None, None], out.flip(-1), out)
    out = out * (0.8 + 0.4 * torch.rand(n, 1, 1, 1)) + 0.2 * torch.randn(n, 1, 1, 1)
    return out + 0.1 * torch.randn_like(out)


class Encoder(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, dim, 3, padding=1, stride=2), nn.BatchNorm2d(dim), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )

    def forward(self, x):
        return self.net(x)


class SimCLR(nn.Module):
    def __init__(self, feat_dim=64, out_dim=32):
        super().__init__()
        self.backbone = Encoder(feat_dim)
        self.projector = nn.Sequential(nn.Linear(feat_dim, feat_dim), nn.ReLU(), nn.Linear(feat_dim, out_dim))

    def forward(self, x):
        return self.projector(self.backbone(x))


def info_nce_loss(features, batch_size, temperature, n_views=2):
    labels = torch.cat([torch.arange(batch_size) for _ in range(n_views)], dim=0)
    labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
    features = F.normalize(features, dim=1)
    similarity_matrix = features @ features.T
    # discard the main diagonal from both the labels and the similarity matrix
    mask = torch.eye(labels.shape[0], dtype=torch.bool)
    labels = labels[~mask].view(labels.shape[0], -1)
    similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
    positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
    negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
    logits = torch.cat([positives, negatives], dim=1) / temperature
    targets = torch.zeros(logits.shape[0], dtype=torch.long)  # positive is column 0
    return logits, targets


unlabeled_x, _ = make_textures(1024, seed=1)
train_x, train_y = make_textures(256, seed=2)
test_x, test_y = make_textures(256, seed=3)

model = SimCLR()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps, eta_min=0.0)
criterion = nn.CrossEntropyLoss()

model.train()
for step in range(1, args.steps + 1):
    idx = torch.randint(0, unlabeled_x.size(0), (args.batch_size,))
    images = torch.cat([augment(unlabeled_x[idx]), augment(unlabeled_x[idx])], dim=0)
    features = model(images)
    logits, labels = info_nce_loss(features, args.batch_size, args.temperature)
    loss = criterion(logits, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 10 == 0 or step == 1:
        top1 = (logits.argmax(1) == labels).float().mean().item()
        print(f"pretrain step {step:3d} loss {loss.item():.4f} contrastive_top1 {top1:.3f} "
              f"lr {scheduler.get_last_lr()[0]:.2e}")

# ---- linear evaluation: frozen backbone, features extracted in eval mode
backbone = model.backbone
backbone.eval()
for p in backbone.parameters():
    p.requires_grad_(False)
with torch.no_grad():
    f_train, f_test = backbone(train_x), backbone(test_x)
mu, sd = f_train.mean(0), f_train.std(0) + 1e-6
f_train, f_test = (f_train - mu) / sd, (f_test - mu) / sd

probe = nn.Linear(f_train.size(1), 4)
probe_opt = torch.optim.Adam(probe.parameters(), lr=0.05)
for step in range(1, 31):
    loss = F.cross_entropy(probe(f_train), train_y)
    probe_opt.zero_grad()
    loss.backward()
    probe_opt.step()
    if step % 10 == 0:
        print(f"probe step {step} loss {loss.item():.4f}")
with torch.no_grad():
    acc = (probe(f_test).argmax(1) == test_y).float().mean().item()
print(f"linear-probe test accuracy {acc:.3f} (chance 0.25)")
