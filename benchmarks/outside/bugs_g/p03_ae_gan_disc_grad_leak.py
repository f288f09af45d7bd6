"""Convolutional autoencoder with a patch discriminator switched on partway (VQGAN-style ``disc_start``);
the generator's adversarial backward leaks gradients into the discriminator.

Bug class: stale gradients from another network's loss (missing ``zero_grad`` /
``requires_grad`` gating between two optimizers).

Modelled on: FoundationVision/OmniTokenizer #15 "maybe bugs in loss backward?" (the
generator's adversarial loss is back-propagated through the discriminator and those
discriminator gradients are then used by the discriminator update),
leffff/FlowModels #3 "student_loss.backward() in LADD" (only the student optimizer is
zeroed, so the discriminator steps with gradients of the student loss) and
Lightning-AI/pytorch-lightning #591 "GAN training with Pytorch Lightning is broken"
(``zero_grad`` only after each optimizer's own step).  The loop clears the
discriminator's gradients after its step instead of before its backward.

What goes wrong: before ``DISC_START`` the generator loss is reconstruction only and
never touches the discriminator, so training is exact.  From ``DISC_START`` on, the
generator loss contains ``-D(G(x))``; its backward writes d(-D(fake))/dθ_D into the
discriminator's ``.grad`` and the following discriminator step applies it together
with the hinge loss gradient -- i.e. the discriminator is partly trained to score
fakes higher, in the direction the generator wants.  No error, losses look normal.

Healthy twin: zeroes the discriminator's gradients right before its own backward, as
in the fixes suggested in those threads.

Onset: one generator step then one discriminator step per iteration, so iteration i
makes optimizer steps 2i (generator) and 2i + 1 (discriminator).  The adversarial term
starts at iteration DISC_START = 8, whose discriminator step K = 2 * 8 + 1 = 17 is the
first one applying leaked gradients.  36 iterations = 72 optimizer steps.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

H = 16
BATCH = 16
ITERS = 36
DISC_START = 8
ADV_WEIGHT = 0.1


def make_batch(gen):
    """Images with 1-3 soft gaussian blobs at random places."""
    xs = torch.linspace(-1, 1, H)
    yy, xx = torch.meshgrid(xs, xs, indexing="ij")
    img = torch.zeros(BATCH, 1, H, H)
    for k in range(3):
        cx = torch.rand(BATCH, 1, 1, generator=gen) * 1.6 - 0.8
        cy = torch.rand(BATCH, 1, 1, generator=gen) * 1.6 - 0.8
        on = (torch.rand(BATCH, 1, 1, generator=gen) < 0.7).float()
        img[:, 0] += on * torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.08)
    return img.clamp(0, 1) * 2 - 1


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 4, 2, 1), nn.LeakyReLU(0.2),
                                 nn.Conv2d(16, 32, 4, 2, 1), nn.LeakyReLU(0.2),
                                 nn.Conv2d(32, 8, 1))
        self.dec = nn.Sequential(nn.ConvTranspose2d(8, 32, 4, 2, 1), nn.LeakyReLU(0.2),
                                 nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.LeakyReLU(0.2),
                                 nn.Conv2d(16, 1, 3, padding=1), nn.Tanh())

    def forward(self, x):
        return self.dec(self.enc(x))


class PatchDiscriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 4, 2, 1), nn.LeakyReLU(0.2),
                                 nn.Conv2d(16, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.LeakyReLU(0.2),
                                 nn.Conv2d(32, 1, 3, padding=1))

    def forward(self, x):
        return self.net(x)


def main():
    gen = torch.Generator().manual_seed(5)
    ae, disc = AutoEncoder(), PatchDiscriminator()
    opt_g = torch.optim.Adam(ae.parameters(), lr=2e-3, betas=(0.5, 0.9))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.9))

    step = 0
    for it in range(ITERS):
        real = make_batch(gen)

        # ---- generator / autoencoder step ----
        recon = ae(real)
        rec_loss = F.l1_loss(recon, real) + F.mse_loss(recon, real)
        if it >= DISC_START:
            g_adv = -disc(recon).mean()
            g_loss = rec_loss + ADV_WEIGHT * g_adv
        else:
            g_adv = torch.zeros(())
            g_loss = rec_loss
        opt_g.zero_grad()
        g_loss.backward()  # from DISC_START on this also fills disc's .grad
        opt_g.step()
        step += 1

        # ---- discriminator step (hinge loss) ----
        if HEALTHY:
            opt_d.zero_grad()
        elif it == DISC_START:
            print(f"ONSET iteration {it}")  # BUG: disc .grad still holds the generator's adversarial gradient
        d_real = disc(real)
        d_fake = disc(recon.detach())
        d_loss = 0.5 * (F.relu(1 - d_real).mean() + F.relu(1 + d_fake).mean())
        d_loss.backward()
        opt_d.step()
        opt_d.zero_grad()
        step += 1

        if it % 6 == 5:
            print(f"iter {it} rec {rec_loss.item():.4f} g_adv {g_adv.item():.4f} d_loss {d_loss.item():.4f}")
    print("done")


if __name__ == "__main__":
    main()
