"""A DCGAN on synthetic 16x16 single-channel images, written the way the PyTorch DCGAN example is.

Modelled on: pytorch/examples DCGAN (https://github.com/pytorch/examples/blob/main/dcgan/main.py)
Habits reproduced: ``weights_init`` applied with ``Module.apply`` (in-place ``normal_``/``fill_``
by class name), BCELoss on a Sigmoid discriminator, a reusable label tensor refilled with
``fill_``, ``netD.zero_grad()``/``netG.zero_grad()`` on the modules rather than the optimizers,
``fake.detach()`` for the discriminator step, two Adam optimizers with beta1 0.5, D(x)/D(G(z))
logged with ``.item()``, images generated from a fixed noise batch every few iterations and
generator/discriminator state dicts saved at the end of every epoch.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)


class Generator(nn.Module):
    def __init__(self, nz, ngf, nc):
        super().__init__()
        self.main = nn.Sequential(
            # nz x 1 x 1 -> (ngf*2) x 4 x 4
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # -> ngf x 8 x 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # -> nc x 16 x 16
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, nc, ndf):
        super().__init__()
        self.main = nn.Sequential(
            # nc x 16 x 16 -> ndf x 8 x 8
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # -> (ndf*2) x 4 x 4
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # -> 1 x 1 x 1
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


def fake_image_dataset(n, nc, size, generator):
    """Blobs of light on a dark background, scaled to [-1, 1] like normalised images."""
    ys = torch.linspace(-1, 1, size).view(1, size, 1)
    xs = torch.linspace(-1, 1, size).view(1, 1, size)
    centres = torch.rand(n, 2, 1, 1, generator=generator) * 1.2 - 0.6
    blobs = torch.exp(-((ys - centres[:, 0]) ** 2 + (xs - centres[:, 1]) ** 2) / 0.1)
    images = blobs.unsqueeze(1).expand(n, nc, size, size) * 2 - 1
    images = images + 0.05 * torch.randn(n, nc, size, size, generator=generator)
    return torch.utils.data.TensorDataset(images.clamp(-1, 1), torch.zeros(n, dtype=torch.long))


def main():
    parser = argparse.ArgumentParser(description="DCGAN on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="training iterations in total")
    parser.add_argument("--seed", type=int, default=0, help="manual seed")
    parser.add_argument("--batchSize", type=int, default=16)
    parser.add_argument("--nz", type=int, default=16, help="size of the latent z vector")
    parser.add_argument("--ngf", type=int, default=16)
    parser.add_argument("--ndf", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--dataset-size", type=int, default=64)
    parser.add_argument("--sample-every", type=int, default=4, help="iterations between fixed-noise samples")
    opt = parser.parse_args()

    random.seed(opt.seed)
    torch.manual_seed(opt.seed)
    nc = 1
    dataset = fake_image_dataset(opt.dataset_size, nc, 16, torch.Generator().manual_seed(opt.seed))
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True, drop_last=True)

    netG = Generator(opt.nz, opt.ngf, nc)
    netG.apply(weights_init)
    netD = Discriminator(nc, opt.ndf)
    netD.apply(weights_init)
    print(netG)
    print(netD)

    criterion = nn.BCELoss()
    fixed_noise = torch.randn(opt.batchSize, opt.nz, 1, 1)
    real_label = 1
    fake_label = 0

    optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    outf = tempfile.TemporaryDirectory()
    iteration = 0
    epoch = 0
    while iteration < opt.steps:
        for i, data in enumerate(dataloader, 0):
            if iteration >= opt.steps:
                break
            ############################
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            ###########################
            # train with real
            netD.zero_grad()
            real_cpu = data[0]
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)

            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()

            # train with fake
            noise = torch.randn(batch_size, opt.nz, 1, 1)
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

            print("[%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"
                  % (epoch, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
            iteration += 1
            if iteration % opt.sample_every == 0:
                fake = netG(fixed_noise)
                torch.save(fake.detach(), os.path.join(outf.name, "fake_samples_epoch_%03d.pt" % epoch))

        # do checkpointing
        torch.save(netG.state_dict(), os.path.join(outf.name, "netG_epoch_%d.pth" % epoch))
        torch.save(netD.state_dict(), os.path.join(outf.name, "netD_epoch_%d.pth" % epoch))
        epoch += 1
    outf.cleanup()


if __name__ == "__main__":
    main()
