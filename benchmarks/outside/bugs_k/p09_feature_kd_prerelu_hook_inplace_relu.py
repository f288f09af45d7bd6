"""Feature + logit knowledge distillation of a small CNN on synthetic texture images.

A wide teacher CNN is trained first (its own optimizer, not counted); then a thin student is
trained with CE + Hinton KD from step 0 and, from the second epoch (step 8) on, a feature-hint loss
in the spirit of clovaai/overhaul-distillation (Heo et al., ICCV 2019): the *pre-ReLU* output of
the second BatchNorm of student and teacher is captured with ``register_forward_hook`` and matched
through a 1x1-conv connector.  Pre-ReLU features are used precisely so that the negative
responses the teacher suppresses are distilled too.

Modelled on: pytorch/pytorch#95617 "forward_hook doesn't work with nn.ReLU(inplace=True)": the
tensor handed to a forward hook is the module's actual output object, and a following
``nn.ReLU(inplace=True)`` rewrites it -- "The input to the hook is already ReLUed!"; ngimel: a
forward hook runs after forward, so for an in-place op this is expected (ptrblck's forum answer:
clone the output in the hook or use ``inplace=False``).

Unusual about the loop: features are harvested through hooks on BatchNorm modules of two networks,
the hint term switches on at step 8, the teacher runs under ``no_grad`` in eval mode.  Buggy: the
stored "pre-ReLU" features are silently post-ReLU for both networks, so the hint loss matches
clipped features (and sends gradient through the ReLU mask).  ``--healthy`` clones in the hook.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
N_CLS, BATCH, STEPS, HINT_FROM = 6, 32, 40, 8


def make_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, N_CLS, (n,), generator=g)
    xx, yy = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    freq = torch.tensor([0.4, 0.8, 1.2, 0.4, 0.8, 1.2])
    orient = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    X = torch.empty(n, 3, 16, 16)
    for i in range(n):
        ph = float(torch.rand(1, generator=g)) * 6.28
        c = int(y[i])
        coord = xx * (1 - orient[c]) + yy * orient[c]
        pat = torch.sin(freq[c] * coord + ph)
        col = torch.rand(3, generator=g)
        X[i] = col[:, None, None] * pat + 0.5 * torch.randn(3, 16, 16, generator=g)
    return X, y


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class Net(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.block1, self.block2 = block(3, w), block(w, 2 * w)
        self.pool = nn.MaxPool2d(2)
        self.block3 = block(2 * w, 2 * w)
        self.fc = nn.Linear(2 * w, N_CLS)

    def forward(self, x):
        x = self.pool(self.block2(self.block1(x)))
        return self.fc(self.block3(x).mean((2, 3)))


class FeatureHook:
    def __init__(self, module, clone):
        self.clone, self.feat = clone, None
        module.register_forward_hook(self)

    def __call__(self, module, inputs, output):
        self.feat = output.clone() if self.clone else output


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    Xtr, ytr = make_images(1024, 1)
    Xte, yte = make_images(256, 2)
    g = torch.Generator().manual_seed(5)

    teacher = Net(32)
    t_opt = torch.optim.SGD(teacher.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    for it in range(60):
        idx = torch.randint(0, len(Xtr), (64,), generator=g)
        loss = F.cross_entropy(teacher(Xtr[idx]), ytr[idx])
        t_opt.zero_grad(); loss.backward(); t_opt.step()
    teacher.eval()
    with torch.no_grad():
        t_acc = (teacher(Xte).argmax(1) == yte).float().mean().item()
    print(f"teacher trained: test acc {t_acc:.3f}", flush=True)

    student = Net(8)
    connector = nn.Sequential(nn.Conv2d(16, 64, 1, bias=False), nn.BatchNorm2d(64))
    s_hook = FeatureHook(student.block2[1], clone=args.healthy)
    t_hook = FeatureHook(teacher.block2[1], clone=args.healthy)
    opt = torch.optim.SGD(list(student.parameters()) + list(connector.parameters()), lr=0.05,
                          momentum=0.9, weight_decay=5e-4, nesterov=True)
    T, neg_frac = 4.0, []
    for step in range(STEPS):
        if step == HINT_FROM and not args.healthy:
            print(f"ONSET step {step}", flush=True)
        idx = torch.randint(0, len(Xtr), (BATCH,), generator=g)
        x, y = Xtr[idx], ytr[idx]
        with torch.no_grad():
            t_logits = teacher(x)
        s_logits = student(x)
        loss_ce = F.cross_entropy(s_logits, y)
        loss_kd = F.kl_div(F.log_softmax(s_logits / T, 1), F.softmax(t_logits / T, 1),
                           reduction="batchmean") * T * T
        loss = 0.5 * loss_ce + 0.5 * loss_kd
        if step >= HINT_FROM:
            s_feat, t_feat = s_hook.feat, t_hook.feat
            neg_frac.append((s_feat < 0).float().mean().item())
            loss_hint = F.mse_loss(connector(s_feat), t_feat)
            loss = loss + 0.5 * loss_hint
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 8 == 0 or step == STEPS - 1:
            print(f"step {step:3d} ce {loss_ce.item():.4f} kd {loss_kd.item():.4f} total {loss.item():.4f}",
                  flush=True)

    student.eval()
    with torch.no_grad():
        s_acc = (student(Xte).argmax(1) == yte).float().mean().item()
        s_hook.clone = t_hook.clone = True            # measure the real pre-ReLU mismatch
        teacher(Xte), student(Xte)
        pre_gap = F.mse_loss(connector.eval()(s_hook.feat), t_hook.feat).item()
    print(f"EVIDENCE fraction of negative entries in the hooked 'pre-ReLU' student feature "
          f"{sum(neg_frac) / len(neg_frac):.3f}; true pre-ReLU hint MSE after training {pre_gap:.4f}; "
          f"student test acc {s_acc:.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
