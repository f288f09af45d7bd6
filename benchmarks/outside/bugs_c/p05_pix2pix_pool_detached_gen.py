"""P05 (class: generator's adversarial loss computed on a detached tensor -- the GAN term silently stops
sending gradient to G, only the L1 term trains it) -- plain PyTorch loop in the pix2pix/CycleGAN code style.

Modelled on nikhilsinghmus/image2reverb#37 "Is fake_spec.detach() in Generator training step intentional?":
in the generator step the discriminator was fed `fake_spec.detach()`, so G_loss1 (adversarial) propagated no
gradient to the generator and only the reconstruction term G_loss2 trained it; the author confirmed "that
.detach() should not be there for the generator step and is a bug".  Same pattern in
samet-akcay/skip-ganomaly#5 "latent loss backward problem" (generator loss computed from a detached fake).

Here a pix2pix model (UNet-ish G, conditional PatchGAN D, GAN + lambda*L1 loss) enables a CycleGAN-style
ImagePool of past (A, fake_B) pairs for the discriminator at iteration 12 (--pool_start).  backward_D stores
the pair it fed to D in self.fake_AB and backward_G re-uses it.  Before the pool is on that pair is the live
(non-detached) tensor; once the pool is on it is the pool's `.data` copy, so from step 12 G's adversarial loss
is still logged but has no gradient path to G.  Healthy twin: backward_G rebuilds cat(real_A, fake_B).
"""
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--n_epochs", type=int, default=3)
parser.add_argument("--iters_per_epoch", type=int, default=12)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--lambda_L1", type=float, default=2.0)
parser.add_argument("--pool_size", type=int, default=24)
parser.add_argument("--pool_start", type=int, default=12)
parser.add_argument("--lr", type=float, default=1e-3)
opt = parser.parse_args()
HEALTHY = opt.healthy
torch.manual_seed(0)

# ---------------- synthetic paired dataset A -> B ----------------
g0 = torch.Generator().manual_seed(31)
colour_kernel = 0.4 * torch.randn(3, 3, 3, 3, generator=g0)


def make_pair(bs, g, size=16):
    a = F.interpolate(torch.randn(bs, 3, 4, 4, generator=g), size=size, mode="bilinear", align_corners=False)
    b = torch.tanh(F.conv2d(a, colour_kernel, padding=1) + 0.2 * a.flip(1))
    return a.clamp(-1, 1), b


class ImagePool:
    """History of generated images (Shrivastava et al.), as in CycleGAN's util/image_pool.py."""

    def __init__(self, pool_size):
        self.pool_size = pool_size
        self.num_imgs = 0
        self.images = []

    def query(self, images):
        if self.pool_size == 0:
            return images
        return_images = []
        for image in images:
            image = torch.unsqueeze(image.data, 0)
            if self.num_imgs < self.pool_size:
                self.num_imgs += 1
                self.images.append(image)
                return_images.append(image)
            elif torch.rand(1).item() > 0.5:
                random_id = int(torch.randint(0, self.pool_size, (1,)).item())
                tmp = self.images[random_id].clone()
                self.images[random_id] = image
                return_images.append(tmp)
            else:
                return_images.append(image)
        return torch.cat(return_images, 0)


class UnetGenerator(nn.Module):
    def __init__(self, ngf=16):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, ngf, 4, 2, 1), nn.LeakyReLU(0.2, True))
        self.down2 = nn.Sequential(nn.Conv2d(ngf, ngf * 2, 4, 2, 1), nn.BatchNorm2d(ngf * 2), nn.LeakyReLU(0.2, True))
        self.up2 = nn.Sequential(nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1), nn.BatchNorm2d(ngf), nn.ReLU(True))
        self.up1 = nn.Sequential(nn.ConvTranspose2d(ngf * 2, 3, 4, 2, 1), nn.Tanh())
        self.dropout = nn.Dropout(0.5)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(d1)
        u2 = self.dropout(self.up2(d2))
        return self.up1(torch.cat([u2, d1], 1))


class NLayerDiscriminator(nn.Module):
    def __init__(self, ndf=16):
        super().__init__()
        self.model = nn.Sequential(
            nn.Conv2d(6, ndf, 4, 2, 1), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ndf * 2, 1, 3, 1, 1))

    def forward(self, x):
        return self.model(x)


class GANLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.loss = nn.BCEWithLogitsLoss()

    def __call__(self, prediction, target_is_real):
        target = torch.ones_like(prediction) if target_is_real else torch.zeros_like(prediction)
        return self.loss(prediction, target)


def init_weights(net, gain=0.02):
    def init_func(m):
        classname = m.__class__.__name__
        if hasattr(m, "weight") and ("Conv" in classname or "Linear" in classname):
            nn.init.normal_(m.weight.data, 0.0, gain)
            if m.bias is not None:
                nn.init.constant_(m.bias.data, 0.0)
        elif "BatchNorm2d" in classname:
            nn.init.normal_(m.weight.data, 1.0, gain)
            nn.init.constant_(m.bias.data, 0.0)
    net.apply(init_func)


class Pix2PixModel:
    def __init__(self, opt):
        self.opt = opt
        self.netG = UnetGenerator()
        self.netD = NLayerDiscriminator()
        init_weights(self.netG)
        init_weights(self.netD)
        self.criterionGAN = GANLoss()
        self.criterionL1 = nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(0.5, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(0.5, 0.999))
        self.fake_AB_pool = ImagePool(opt.pool_size)
        self.use_pool = False

    def set_input(self, a, b):
        self.real_A, self.real_B = a, b

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    @staticmethod
    def set_requires_grad(net, requires_grad):
        for p in net.parameters():
            p.requires_grad = requires_grad

    def backward_D(self):
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        if self.use_pool:
            fake_AB = self.fake_AB_pool.query(fake_AB)
        self.fake_AB = fake_AB
        pred_fake = self.netD(fake_AB.detach())
        self.loss_D_fake = self.criterionGAN(pred_fake, False)
        real_AB = torch.cat((self.real_A, self.real_B), 1)
        self.loss_D_real = self.criterionGAN(self.netD(real_AB), True)
        self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5
        self.loss_D.backward()

    def backward_G(self):
        if HEALTHY:
            fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        else:
            fake_AB = self.fake_AB  # BUG: re-uses the pair from backward_D (a detached pool copy once the pool is on)
        pred_fake = self.netD(fake_AB)
        self.loss_G_GAN = self.criterionGAN(pred_fake, True)
        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_L1
        self.loss_G = self.loss_G_GAN + self.loss_G_L1
        self.loss_G.backward()

    def optimize_parameters(self):
        self.forward()
        self.set_requires_grad(self.netD, True)
        self.optimizer_D.zero_grad()
        self.backward_D()
        self.optimizer_D.step()
        self.set_requires_grad(self.netD, False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()


model = Pix2PixModel(opt)
val_gen = torch.Generator().manual_seed(4)
val_A, val_B = make_pair(32, val_gen)
train_gen = torch.Generator().manual_seed(9)
total_iters = 0
for epoch in range(1, opt.n_epochs + 1):
    model.netG.train()
    for i in range(opt.iters_per_epoch):
        if total_iters == opt.pool_start:
            model.use_pool = True
            print(f"iter {total_iters}: enabling image pool (size {opt.pool_size}) for the discriminator")
            if not HEALTHY:
                print(f"ONSET step {total_iters}")
        a, b = make_pair(opt.batch_size, train_gen)
        model.set_input(a, b)
        model.optimize_parameters()
        if total_iters % 3 == 0:
            print(f"(epoch: {epoch}, iters: {total_iters}) G_GAN: {model.loss_G_GAN.item():.3f} "
                  f"G_L1: {model.loss_G_L1.item():.3f} D_real: {model.loss_D_real.item():.3f} "
                  f"D_fake: {model.loss_D_fake.item():.3f}")
        total_iters += 1
    model.netG.eval()
    with torch.no_grad():
        val_l1 = F.l1_loss(model.netG(val_A), val_B).item()
    print(f"End of epoch {epoch}: val L1 {val_l1:.4f}")
    torch.save(model.netG.state_dict(), "p05_latest_net_G.pth")
    torch.save(model.netD.state_dict(), "p05_latest_net_D.pth")
