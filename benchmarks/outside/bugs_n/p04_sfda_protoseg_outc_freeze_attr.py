"""Source-free domain adaptation for abdominal organ segmentation with prototype anchors
(ProtoContra / "prototype feature alignment", MICCAI 2023): a small U-Net whose 1x1 output
conv ``outc`` holds K prototypes per class is first trained on labelled source-domain CT
slices, then adapted to an unlabelled target domain by aligning target features to the
frozen source prototypes (target-to-prototype entropy + prototype-to-target attraction).

Modelled on: CSCYQJ/MICCAI23-ProtoContra-SFDA issue #18 "Implementation bug? It seems like the
last layer is not frozen?": ``trainers/target_adapt_PFA_trainer.py`` freezes the classifier
with ``self.model.outc.requires_grad = False``.  ``outc`` is an ``nn.Module``, so this only
sets a Python attribute; its parameters keep ``requires_grad=True``, receive gradients through
``source_prototypes`` (a view of ``outc.conv.weight``) and are updated by Adam, so the
"anchors" drift during adaptation.  The fix freezes the parameters themselves
(``requires_grad_(False)``), as the issue's follow-up confirms.

Unusual about the loop: one Adam (weight decay) for source training and adaptation, the
prototypes are a reshaped view of a conv weight, cosine-similarity segmentation head,
StepLR per "epoch", AMP-style structure kept simple (fp32 on CPU), Dice on target slices.
Run: python p04_sfda_protoseg_outc_freeze_attr.py [--healthy]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

NUM_CLASSES, NUM_PROTOS, FEAT, IMG = 3, 2, 16, 32
SOURCE_STEPS, ADAPT_STEPS, BATCH, STEPS_PER_EPOCH = 15, 25, 8, 5


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class OutConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, f):  # cosine similarity to every prototype
        w = F.normalize(self.conv.weight.view(self.conv.out_channels, -1), dim=1)
        return torch.einsum("bchw,kc->bkhw", F.normalize(f, dim=1), w)


class ProtoUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inc, self.down = conv_block(1, 16), conv_block(16, 32)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec = conv_block(32, FEAT)
        self.outc = OutConv(FEAT, NUM_CLASSES * NUM_PROTOS)

    def forward(self, x, only_feature=False):
        x1 = self.inc(x)
        x2 = self.down(F.max_pool2d(x1, 2))
        f = self.dec(torch.cat([x1, self.up(x2)], 1))
        sims = self.outc(f).view(x.size(0), NUM_CLASSES, NUM_PROTOS, IMG, IMG)
        predict = sims.max(2)[0] * 10.0
        return (f, predict) if only_feature else predict


class ProtoLoss(nn.Module):
    def __init__(self, nav_t=0.1, beta=0.01):
        super().__init__()
        self.nav_t, self.beta = nav_t, beta

    def forward(self, prototypes, feats):
        sim = F.normalize(feats, dim=1) @ F.normalize(prototypes, dim=1).t() / self.nav_t  # N x K
        p_t2p = F.softmax(sim, 1)
        t2p = -(p_t2p * F.log_softmax(sim, 1)).sum(1).mean()
        p_p2t = F.softmax(sim, 0)  # each prototype attends over target features
        p2t = -(p_p2t * sim * self.nav_t).sum(0).mean()
        return t2p, self.beta * p2t


def make_slices(n, g, domain):
    yy, xx = torch.meshgrid(torch.arange(IMG).float(), torch.arange(IMG).float(), indexing="ij")
    imgs, segs = torch.zeros(n, 1, IMG, IMG), torch.zeros(n, IMG, IMG, dtype=torch.long)
    for i in range(n):
        cx, cy, rx, ry = (torch.rand(4, generator=g) * torch.tensor([8, 8, 4, 3]) + torch.tensor([10, 10, 6, 5])).tolist()
        liver = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 < 1
        kx, ky = (torch.rand(2, generator=g) * 6 + 20).tolist()
        kidney = ((xx - kx) ** 2 + (yy - ky) ** 2) < 12
        segs[i][liver], segs[i][kidney] = 1, 2
        a, b = (0.8, 0.4) if domain == "source" else (0.45, 0.95)  # target scanner: other contrast
        img = a * liver.float() + b * kidney.float()
        if domain == "target":
            img = img + 0.3 * (xx / IMG)  # bias field
        imgs[i, 0] = img + 0.08 * torch.randn(IMG, IMG, generator=g)
    return imgs, segs


def mean_dice(pred, seg):
    d = []
    for c in range(1, NUM_CLASSES):
        p, t = pred == c, seg == c
        d.append((2 * (p & t).sum() / (p.sum() + t.sum()).clamp(min=1)).item())
    return sum(d) / len(d)


g = torch.Generator().manual_seed(1)
src_x, src_y = make_slices(80, g, "source")
tgt_x, tgt_y = make_slices(80, g, "target")  # target labels only for the final report
model = ProtoUNet()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.999), weight_decay=0.0005)
schedular = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
order = torch.Generator().manual_seed(2)

step = 0
# ---- stage 1: supervised training on the source site ----
for it in range(SOURCE_STEPS):
    b = torch.randint(0, len(src_x), (BATCH,), generator=order)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(src_x[b]), src_y[b])
    loss.backward()
    optimizer.step()
    print(f"[source] step {step} ce {loss.item():.4f}")
    step += 1

# ---- stage 2: source-free adaptation with prototype feature alignment ----
source_prototypes = model.outc.conv.weight.view(NUM_CLASSES * NUM_PROTOS, FEAT)
if args.healthy:
    model.outc.requires_grad_(False)  # freeze the parameters of the prototype layer
else:
    model.outc.requires_grad = False  # only sets an attribute on the module
outc_at_start = model.outc.conv.weight.detach().clone()
criterion_proto = ProtoLoss()
for it in range(ADAPT_STEPS):
    if it == 0 and not args.healthy:
        print(f"ONSET step {step}")
    b = torch.randint(0, len(tgt_x), (BATCH,), generator=order)
    optimizer.zero_grad()
    target_f, predict = model(tgt_x[b], only_feature=True)
    target_f = target_f.permute(0, 2, 3, 1).reshape(-1, FEAT)
    t2p_loss, p2t_loss = criterion_proto(source_prototypes, target_f)
    loss = t2p_loss + p2t_loss
    loss.backward()
    optimizer.step()
    drift = (model.outc.conv.weight - outc_at_start).norm().item()
    print(f"[adapt] step {step} t2p {t2p_loss.item():.4f} p2t {p2t_loss.item():.4f} outc_drift {drift:.5f}")
    if (it + 1) % STEPS_PER_EPOCH == 0:
        schedular.step()
    step += 1

model.eval()
with torch.no_grad():
    dice = mean_dice(model(tgt_x).argmax(1), tgt_y)
print(f"EVIDENCE ||outc.weight - weight at adaptation start|| = {drift:.5f} "
      f"(requires_grad of outc.conv.weight: {model.outc.conv.weight.requires_grad}); target dice {dice:.3f}")
