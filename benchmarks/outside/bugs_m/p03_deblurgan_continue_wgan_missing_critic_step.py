"""DeblurGAN-v2-style image deblurring: L1 pre-training of the generator, then WGAN training with
a global and a patch critic.

Modelled on: zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch#7 "discriminators are not updated in the
Continue_train_WGAN function in trainer.py" (https://github.com/zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch/issues/7).
``trainer.py`` has ``Pre_train(opt)`` (generator, L1 only) and ``Continue_train_WGAN(opt)`` (generator +
global critic + patch critic + perceptual loss).  In the second function both critic losses are
back-propagated, but ``optimizer_D1.step()`` / ``optimizer_D2.step()`` are never called.  The critics
stay at their random initialisation while the generator keeps optimising "adversarial" terms against
them; the author confirmed it as a bug.  ``--healthy`` adds the two missing ``step()`` calls.

Unusual about the loop: two training functions run one after the other, as ``train.py`` runs
``Pre_train`` and then ``Continue_train_WGAN`` from the saved generator.  The generator optimizer is
re-created in the second phase, and the main-optimizer step count continues across both phases
(pre-train steps 0-9, WGAN steps 10-34).  Each WGAN iteration runs the critic backward passes and
then the generator pass, with the patch critic on a random crop shared by fake and real images.  The
"perceptual" network is a frozen random conv stack used in place of VGG16, because no weights can be
downloaded here.
"""
import argparse
import os
import random
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
random.seed(0)


def get_opt():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--pre_iters", type=int, default=10)
    p.add_argument("--wgan_iters", type=int, default=25)
    p.add_argument("--lr_g", type=float, default=2e-4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--b1", type=float, default=0.5)
    p.add_argument("--b2", type=float, default=0.999)
    p.add_argument("--crop_size", type=int, default=32)
    p.add_argument("--patch_size", type=int, default=16)
    p.add_argument("--train_batch_size", type=int, default=16)
    p.add_argument("--lambda_l1", type=float, default=1.0)
    p.add_argument("--lambda_percep", type=float, default=0.2)
    p.add_argument("--lambda_gan", type=float, default=0.02)
    return p.parse_args()


# ----------------------------------------------------------------------------- data: sharp / motion-blurred pairs
def sharp_batch(n, size, gen):
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    imgs = []
    for _ in range(n):
        f = torch.rand(3, generator=gen) * 6 + 2
        ph = torch.rand(3, generator=gen) * 6.28
        stripes = torch.stack([torch.sin(f[c] * (xx * torch.cos(ph[c]) + yy * torch.sin(ph[c]))) for c in range(3)])
        cx, cy, r = (torch.rand(3, generator=gen) * torch.tensor([1.2, 1.2, 0.4]) - torch.tensor([0.6, 0.6, -0.2]))
        disk = (((xx - cx) ** 2 + (yy - cy) ** 2) < r ** 2).float()
        imgs.append(0.5 * stripes * (1 - disk) + disk * (torch.rand(3, 1, 1, generator=gen) * 2 - 1))
    return torch.stack(imgs).clamp(-1, 1)


def motion_blur(x, gen, k=7):
    horizontal = torch.rand(1, generator=gen).item() < 0.5
    ker = torch.zeros(k, k)
    ker[k // 2, :] = 1.0 / k
    if not horizontal:
        ker = ker.t()
    ker = ker.expand(3, 1, k, k)
    return F.conv2d(F.pad(x, [k // 2] * 4, mode="replicate"), ker, groups=3)


def batches(opt, seed):
    gen = torch.Generator().manual_seed(seed)
    while True:
        target = sharp_batch(opt.train_batch_size, opt.crop_size, gen)
        yield motion_blur(target, gen), target


# ----------------------------------------------------------------------------- networks (utils.create_*)
class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1), nn.InstanceNorm2d(c, affine=True))

    def forward(self, x):
        return x + self.body(x)


class Generator(nn.Module):
    def __init__(self, c=24):
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(3, c, 5, padding=2), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU())
        self.body = nn.Sequential(ResBlock(2 * c), ResBlock(2 * c))
        self.up = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1), nn.ReLU())
        self.tail = nn.Conv2d(2 * c, 3, 3, padding=1)

    def forward(self, x):
        h0 = self.head(x)
        h = self.up(self.body(self.down(h0)))
        return torch.clamp(x + self.tail(torch.cat([h, h0], 1)), -1, 1)  # global residual


class Critic(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, c, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(c, 2 * c, 4, 2, 1),
                                 nn.LeakyReLU(0.2), nn.Conv2d(2 * c, 4 * c, 3, 1, 1), nn.LeakyReLU(0.2),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * c, 1))

    def forward(self, x):
        return self.net(x)


def create_perceptualnet():
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
    for p in net.parameters():
        p.requires_grad = False
    return net.eval()


def psnr(a, b):
    mse = F.mse_loss((a + 1) / 2, (b + 1) / 2).item()
    return 10 * torch.log10(torch.tensor(1.0 / max(mse, 1e-10))).item()


# ----------------------------------------------------------------------------- Pre_train
def Pre_train(opt, save_path):
    generator = Generator()
    criterion_L1 = nn.L1Loss()
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr_g, betas=(opt.b1, opt.b2))
    data = batches(opt, seed=1)
    for it in range(opt.pre_iters):
        true_input, true_target = next(data)
        optimizer_G.zero_grad()
        fake_target = generator(true_input)
        loss = criterion_L1(fake_target, true_target)
        loss.backward()
        optimizer_G.step()
        if it % 5 == 0:
            print(f"[pre  {it:2d}] [Pixellevel L1 Loss: {loss.item():.4f}]")
    torch.save(generator.state_dict(), save_path)


# ----------------------------------------------------------------------------- Continue_train_WGAN
def Continue_train_WGAN(opt, load_path):
    criterion_L1 = nn.L1Loss()
    generator = Generator()
    generator.load_state_dict(torch.load(load_path))
    global_discriminator, patch_discriminator = Critic(), Critic()
    perceptualnet = create_perceptualnet()
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D1 = torch.optim.Adam(global_discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D2 = torch.optim.Adam(patch_discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    d_init = [p.detach().clone() for p in list(global_discriminator.parameters()) + list(patch_discriminator.parameters())]
    data = batches(opt, seed=2)
    if not HEALTHY:
        print(f"ONSET step {opt.pre_iters}")
    for it in range(opt.wgan_iters):
        true_input, true_target = next(data)

        # Train Discriminator
        optimizer_D1.zero_grad()
        optimizer_D2.zero_grad()
        fake_target = generator(true_input)
        rand_h = random.randint(0, opt.crop_size - opt.patch_size)
        rand_w = random.randint(0, opt.crop_size - opt.patch_size)
        fake_target_patch = fake_target[:, :, rand_h:rand_h + opt.patch_size, rand_w:rand_w + opt.patch_size]
        true_target_patch = true_target[:, :, rand_h:rand_h + opt.patch_size, rand_w:rand_w + opt.patch_size]
        loss_D1 = -torch.mean(global_discriminator(true_target)) + torch.mean(global_discriminator(fake_target.detach()))
        loss_D1.backward()
        loss_D2 = -torch.mean(patch_discriminator(true_target_patch)) + torch.mean(patch_discriminator(fake_target_patch.detach()))
        loss_D2.backward()
        if HEALTHY:
            optimizer_D1.step()
            optimizer_D2.step()

        # Train Generator
        optimizer_G.zero_grad()
        fake_target = generator(true_input)
        fake_target_patch = fake_target[:, :, rand_h:rand_h + opt.patch_size, rand_w:rand_w + opt.patch_size]
        Pixellevel_L1_Loss = criterion_L1(fake_target, true_target)
        Perceptual_Loss = criterion_L1(perceptualnet(fake_target), perceptualnet(true_target))
        Global_GAN_Loss = -torch.mean(global_discriminator(fake_target))
        Patch_GAN_Loss = -torch.mean(patch_discriminator(fake_target_patch))
        loss = (opt.lambda_l1 * Pixellevel_L1_Loss + opt.lambda_percep * Perceptual_Loss
                + opt.lambda_gan * (Global_GAN_Loss + Patch_GAN_Loss))
        loss.backward()
        optimizer_G.step()
        if it % 6 == 0:
            print(f"[wgan {opt.pre_iters + it:2d}] [L1: {Pixellevel_L1_Loss.item():.4f}] [Percep: {Perceptual_Loss.item():.4f}] "
                  f"[D1: {loss_D1.item():.4f}] [D2: {loss_D2.item():.4f}]")

    d_now = list(global_discriminator.parameters()) + list(patch_discriminator.parameters())
    moved = max((a - b).abs().max().item() for a, b in zip(d_now, d_init))
    with torch.no_grad():
        val_in, val_gt = next(batches(opt, seed=99))
        gap = (global_discriminator(val_gt).mean() - global_discriminator(generator(val_in)).mean()).item()
        score = psnr(generator(val_in), val_gt)
    return moved, gap, score


if __name__ == "__main__":
    opt = get_opt()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "DeblurGANv2_pre_iter10.pth")
        Pre_train(opt, path)
        moved, gap, score = Continue_train_WGAN(opt, path)
    print(f"val PSNR {score:.2f} dB")
    print(f"EVIDENCE max abs change of critic weights during WGAN phase {moved:.6f}; "
          f"global critic real-fake gap on val {gap:.4f}")
