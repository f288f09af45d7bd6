"""P04 (class: LR scheduler stepped at the wrong granularity -- an epoch-based StepLR stepped every iteration,
so the learning rate collapses towards zero within a few iterations) -- plain PyTorch loop (SRResNet -> SRGAN).

Modelled on Lornatang/SRGAN-PyTorch#1 "Learning rate scheduler is working incorrect": StepLR schedulers built
with `step_size=epochs // 2, gamma=0.1` for G and D were meant to be stepped once per epoch, but
`schedulerD.step()` / `schedulerG.step()` were called at each training step, "which means that learning rate is
quickly becoming zero after a few training steps.  The SRGAN does not seem to train."  (Maintainer: "Yeah, I
found it. I will fix it.")  The same per-epoch vs per-iteration confusion is discussed in pytorch/pytorch#3814.

Program: stage 1 (steps 0-11) PSNR-oriented SRResNet pre-training with MSE; stage 2 (steps 12-35, 4 epochs x 6
iterations) adversarial SRGAN training with StepLR(step_size=epochs//2=2, gamma=0.1) on both optimizers.  In
the buggy variant the schedulers are stepped inside the batch loop, so after two stage-2 iterations the LR is
divided by 10 (and again every 2 iterations).  The first optimizer step that runs with a wrong LR is step 14.
Healthy twin: the schedulers are stepped after each epoch.
"""
import argparse
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--psnr-steps", type=int, default=12)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--iters-per-epoch", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
HEALTHY = args.healthy
torch.manual_seed(0)


def make_hr(bs, g, size=16):
    """Smooth synthetic 'natural' textures: sums of random oriented sinusoids."""
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    img = torch.zeros(bs, 3, size, size)
    for _ in range(3):
        fx = torch.rand(bs, 3, 1, 1, generator=g) * 3
        fy = torch.rand(bs, 3, 1, 1, generator=g) * 3
        ph = torch.rand(bs, 3, 1, 1, generator=g) * 2 * math.pi
        img = img + torch.sin(2 * math.pi * (fx * xx + fy * yy) + ph)
    return (img / 3.0).clamp(-1, 1)


def degrade(hr):
    return F.avg_pool2d(hr, 2)


class ResidualConvBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.rcb = nn.Sequential(nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch), nn.PReLU(),
                                 nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch))

    def forward(self, x):
        return x + self.rcb(x)


class SRResNet(nn.Module):
    def __init__(self, ch=16, n_blocks=3):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, ch, 9, 1, 4), nn.PReLU())
        self.trunk = nn.Sequential(*[ResidualConvBlock(ch) for _ in range(n_blocks)])
        self.conv2 = nn.Sequential(nn.Conv2d(ch, ch, 3, 1, 1, bias=False), nn.BatchNorm2d(ch))
        self.upsampling = nn.Sequential(nn.Conv2d(ch, ch * 4, 3, 1, 1), nn.PixelShuffle(2), nn.PReLU())
        self.conv3 = nn.Conv2d(ch, 3, 9, 1, 4)

    def forward(self, x):
        out1 = self.conv1(x)
        out = self.conv2(self.trunk(out1)) + out1
        return torch.tanh(self.conv3(self.upsampling(out)))


class Discriminator(nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, ch, 3, 1, 1), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ch, ch, 3, 2, 1, bias=False), nn.BatchNorm2d(ch), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ch, 2 * ch, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * ch), nn.LeakyReLU(0.2, True),
            nn.Conv2d(2 * ch, 2 * ch, 3, 2, 1, bias=False), nn.BatchNorm2d(2 * ch), nn.LeakyReLU(0.2, True))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * ch * 16, 64), nn.LeakyReLU(0.2, True),
                                        nn.Linear(64, 1))

    def forward(self, x):
        return self.classifier(self.features(x))


val_gen = torch.Generator().manual_seed(21)
val_hr = make_hr(32, val_gen)
val_lr = degrade(val_hr)


@torch.no_grad()
def validate(g_model):
    g_model.eval()
    sr = g_model(val_lr)
    mse = F.mse_loss((sr + 1) / 2, (val_hr + 1) / 2)
    g_model.train()
    return 10 * math.log10(1.0 / mse.item())


g_model = SRResNet()
d_model = Discriminator()
pixel_criterion = nn.MSELoss()
adversarial_criterion = nn.BCEWithLogitsLoss()
train_gen = torch.Generator().manual_seed(8)
global_step = 0

# ---------------- stage 1: train_srresnet (PSNR-oriented) ----------------
p_optimizer = torch.optim.Adam(g_model.parameters(), lr=1e-3, betas=(0.9, 0.999))
for it in range(args.psnr_steps):
    hr = make_hr(args.batch_size, train_gen)
    lr_img = degrade(hr)
    p_optimizer.zero_grad(set_to_none=True)
    loss = pixel_criterion(g_model(lr_img), hr)
    loss.backward()
    p_optimizer.step()
    if it % 4 == 0:
        print(f"[SRResNet] step {global_step} pixel_loss {loss.item():.5f}")
    global_step += 1
print(f"[SRResNet] val PSNR {validate(g_model):.2f} dB")
torch.save({"state_dict": g_model.state_dict()}, "p04_srresnet.pth.tar")

# ---------------- stage 2: train_srgan ----------------
d_optimizer = torch.optim.Adam(d_model.parameters(), lr=2e-4, betas=(0.9, 0.999))
g_optimizer = torch.optim.Adam(g_model.parameters(), lr=2e-4, betas=(0.9, 0.999))
d_scheduler = torch.optim.lr_scheduler.StepLR(d_optimizer, step_size=args.epochs // 2, gamma=0.1)
g_scheduler = torch.optim.lr_scheduler.StepLR(g_optimizer, step_size=args.epochs // 2, gamma=0.1)
best_psnr = 0.0
onset_reported = False
for epoch in range(args.epochs):
    g_model.train()
    d_model.train()
    for it in range(args.iters_per_epoch):
        hr = make_hr(args.batch_size, train_gen)
        lr_img = degrade(hr)
        real_label = torch.ones(hr.size(0), 1)
        fake_label = torch.zeros(hr.size(0), 1)
        expected_lr = 2e-4 * 0.1 ** (epoch // (args.epochs // 2))
        if not HEALTHY and not onset_reported and abs(g_optimizer.param_groups[0]["lr"] - expected_lr) > 1e-12:
            print(f"ONSET step {global_step}")
            onset_reported = True

        # (1) update discriminator
        for p in d_model.parameters():
            p.requires_grad = True
        d_optimizer.zero_grad(set_to_none=True)
        sr = g_model(lr_img)
        d_loss_hr = adversarial_criterion(d_model(hr), real_label)
        d_loss_sr = adversarial_criterion(d_model(sr.detach()), fake_label)
        d_loss = d_loss_hr + d_loss_sr
        d_loss.backward()
        d_optimizer.step()

        # (2) update generator
        for p in d_model.parameters():
            p.requires_grad = False
        g_optimizer.zero_grad(set_to_none=True)
        pixel_loss = pixel_criterion(sr, hr)
        adversarial_loss = 1e-3 * adversarial_criterion(d_model(sr), real_label)
        g_loss = pixel_loss + adversarial_loss
        g_loss.backward()
        g_optimizer.step()

        if not HEALTHY:
            # BUG: epoch-based schedulers stepped every iteration
            d_scheduler.step()
            g_scheduler.step()
        if global_step % 3 == 0:
            print(f"[SRGAN] epoch {epoch} step {global_step} d_loss {d_loss.item():.4f} "
                  f"pixel {pixel_loss.item():.5f} adv {adversarial_loss.item():.5f} "
                  f"lr {g_optimizer.param_groups[0]['lr']:.2e}")
        global_step += 1
    if HEALTHY:
        d_scheduler.step()
        g_scheduler.step()
    psnr = validate(g_model)
    print(f"[SRGAN] epoch {epoch} val PSNR {psnr:.2f} dB")
    if psnr > best_psnr:
        best_psnr = psnr
        torch.save({"epoch": epoch, "state_dict": g_model.state_dict()}, "p04_g_best.pth.tar")
    torch.save({"epoch": epoch, "state_dict": d_model.state_dict()}, "p04_d_last.pth.tar")
print(f"done: {global_step} steps, best PSNR {best_psnr:.2f} dB")
