"""DCGAN on synthetic 16x16 "blob" images.

Modelled on pytorch/examples ``dcgan/main.py`` (Radford et al., 2015): a
transposed-convolution generator and a strided-convolution discriminator,
each with its own Adam optimizer (lr=2e-4, betas=(0.5, 0.999)), DCGAN weight
init (N(0, 0.02) for conv weights, N(1, 0.02) for BatchNorm scales), and the
alternating update from the example:

  (1) update D: maximise log(D(x)) + log(1 - D(G(z)))  (fake batch detached)
  (2) update G: maximise log(D(G(z)))                  (non-saturating loss)

The real data are small Gaussian blobs at random positions, so the
discriminator has something spatial to learn.  A fixed noise vector is used to
monitor the generator, as in the example.  Runs 60 iterations (60 steps of
each optimizer) on CPU.
"""
import argparse

import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(999)

NZ, NGF, NDF, NC = 16, 32, 32, 1
BATCH = 32
ITERS = 60


def make_real_batch(n, gen):
    """Gaussian blobs at random centres in a 16x16 image, scaled to [-1, 1]."""
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    cy = torch.rand(n, 1, 1, generator=gen) * 8 + 4
    cx = torch.rand(n, 1, 1, generator=gen) * 8 + 4
    img = torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * 2.0 ** 2))
    return (img * 2 - 1).unsqueeze(1)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            # z: NZ x 1 x 1 -> (NGF*2) x 4 x 4
            nn.ConvTranspose2d(NZ, NGF * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(NGF * 2),
            nn.ReLU(True),
            # -> NGF x 8 x 8
            nn.ConvTranspose2d(NGF * 2, NGF, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NGF),
            nn.ReLU(True),
            # -> NC x 16 x 16
            nn.ConvTranspose2d(NGF, NC, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            # NC x 16 x 16 -> NDF x 8 x 8
            nn.Conv2d(NC, NDF, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # -> (NDF*2) x 4 x 4
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(NDF * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # -> 1 x 1 x 1
            nn.Conv2d(NDF * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


netG = Generator()
netG.apply(weights_init)
netD = Discriminator()
netD.apply(weights_init)

criterion = nn.BCELoss()
fixed_noise = torch.randn(64, NZ, 1, 1)
real_label, fake_label = 1.0, 0.0

optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

data_gen = torch.Generator().manual_seed(0)
history = []
for i in range(ITERS):
    real = make_real_batch(BATCH, data_gen)
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    netD.zero_grad()
    label = torch.full((BATCH,), real_label)
    output = netD(real)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()

    noise = torch.randn(BATCH, NZ, 1, 1)
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()

    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()

    history.append((errD.item(), errG.item()))
    if i % 10 == 0 or i == ITERS - 1:
        print(f"[{i}/{ITERS}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f} "
              f"D(x): {D_x:.4f} D(G(z)): {D_G_z1:.4f} / {D_G_z2:.4f}")

netG.eval()
with torch.no_grad():
    samples = netG(fixed_noise)
print(f"fixed-noise samples: mean={samples.mean():.3f} std={samples.std():.3f}")
first = sum(d for d, _ in history[:10]) / 10
last = sum(d for d, _ in history[-10:]) / 10
print(f"mean D loss first 10 iters {first:.4f} -> last 10 iters {last:.4f}")
