"""Tiny single-object box regressor trained with an Ultralytics-style loop.

A small CNN predicts (objectness-free) box centre/size and a shape class for synthetic 32x32
images that contain one bright rectangle.  The loop copies the structure of the Ultralytics
trainer: nominal batch size `nbs` reached through gradient accumulation on a *global* batch
counter (`ni - last_opt_step >= accumulate`), SGD with nesterov momentum, grad clipping and a
ModelEMA updated after every optimizer step.

Modelled on: ultralytics/ultralytics PR #11217 "fix double zero_grad call messing up gradient
accumulation".  `optimizer.zero_grad()` was called both at the start of every epoch and inside
`optimizer_step()`.  Because the step fires on the global counter, the gradients of the last
`nb % accumulate` batches of an epoch were wiped by the epoch-start zero_grad, so the first
optimizer step of every later epoch is taken on a partial accumulation.

Unusual about the loop: accumulation windows straddle epoch boundaries on purpose.  Epoch 0 is
unaffected; the first optimizer step of epoch 1 is the first wrong one.
--healthy: the epoch-start zero_grad is removed (the fix in the PR).
"""
import copy
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    imgs = torch.rand(n, 1, 32, 32, generator=g) * 0.2
    boxes = torch.zeros(n, 4)
    cls = torch.zeros(n)
    for i in range(n):
        w, h = torch.randint(4, 16, (2,), generator=g).tolist()
        x0 = torch.randint(0, 32 - w, (1,), generator=g).item()
        y0 = torch.randint(0, 32 - h, (1,), generator=g).item()
        imgs[i, 0, y0:y0 + h, x0:x0 + w] += 0.8
        boxes[i] = torch.tensor([(x0 + w / 2) / 32, (y0 + h / 2) / 32, w / 32, h / 32])
        cls[i] = float(w > h)
    return TensorDataset(imgs, boxes, cls)


class TinyDet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(),
            nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.SiLU(),
            nn.Conv2d(32, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.SiLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.box = nn.Linear(32, 4)
        self.cls = nn.Linear(32, 1)

    def forward(self, x):
        f = self.backbone(x)
        return self.box(f).sigmoid(), self.cls(f).squeeze(1)


class ModelEMA:
    def __init__(self, model, decay=0.9999, tau=20):
        self.ema = copy.deepcopy(model).eval()
        self.updates = 0
        self.decay = lambda x: decay * (1 - math.exp(-x / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        self.updates += 1
        d = self.decay(self.updates)
        msd = model.state_dict()
        with torch.no_grad():
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1 - d) * msd[k].detach()


def main():
    torch.manual_seed(0)
    bs, nbs, epochs = 4, 16, 3
    train_loader = DataLoader(make_data(150, 1), batch_size=bs, shuffle=True,
                              generator=torch.Generator().manual_seed(2))
    model = TinyDet()
    accumulate = max(round(nbs / bs), 1)
    weight_decay = 5e-4 * bs * accumulate / nbs
    g_bn, g_w, g_b = [], [], []
    for m in model.modules():
        for n, p in m.named_parameters(recurse=False):
            if n == "bias":
                g_b.append(p)
            elif isinstance(m, nn.BatchNorm2d):
                g_bn.append(p)
            else:
                g_w.append(p)
    optimizer = torch.optim.SGD(g_bn, lr=0.01, momentum=0.937, nesterov=True)
    optimizer.add_param_group({"params": g_w, "weight_decay": weight_decay})
    optimizer.add_param_group({"params": g_b, "weight_decay": 0.0})
    ema = ModelEMA(model)

    nb = len(train_loader)
    last_opt_step = -1
    step = 0
    pending = 0            # batches whose gradients sit in .grad right now
    discarded = 0
    used = 0
    onset_printed = False
    for epoch in range(epochs):
        model.train()
        if not HEALTHY:
            if pending and not onset_printed:
                print(f"ONSET step {step}")
                onset_printed = True
            discarded += pending
            pending = 0
            optimizer.zero_grad()
        for i, (imgs, boxes, cls) in enumerate(train_loader):
            ni = i + nb * epoch
            pbox, pcls = model(imgs)
            loss_box = F.l1_loss(pbox, boxes)
            loss_cls = F.binary_cross_entropy_with_logits(pcls, cls)
            loss = (7.5 * loss_box + 0.5 * loss_cls) * imgs.shape[0]
            loss.backward()
            pending += 1
            if ni - last_opt_step >= accumulate:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                optimizer.step()
                optimizer.zero_grad()
                ema.update(model)
                print(f"epoch {epoch} step {step:3d} ni {ni:3d} micro {pending} "
                      f"loss {loss.item() / imgs.shape[0]:.4f}")
                used += pending
                pending = 0
                last_opt_step = ni
                step += 1

    with torch.no_grad():
        val = make_data(64, 99)
        pbox, _ = ema.ema(val.tensors[0])
        val_l1 = F.l1_loss(pbox, val.tensors[1]).item()
    total = nb * epochs
    print(f"EVIDENCE batches_discarded_at_epoch_start={discarded} "
          f"batches_in_updates={used}/{total} optimizer_steps={step} ema_val_l1={val_l1:.4f}")


if __name__ == "__main__":
    main()
