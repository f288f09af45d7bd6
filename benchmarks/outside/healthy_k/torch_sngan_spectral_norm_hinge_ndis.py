"""SN-GAN: hinge-loss GAN whose discriminator uses spectral normalisation, 5 D steps per G step.

Modelled on: christiancosgrove/pytorch-spectral-normalization-gan ``main.py`` /
``model.py`` (Miyato et al., "Spectral Normalization for GANs", ICLR 2018):
``disc_iters = 5`` discriminator updates on the same real batch with fresh ``z``,
hinge loss ``relu(1 - D(x)).mean() + relu(1 + D(G(z))).mean()`` and ``-D(G(z)).mean()``,
Adam(betas=(0.0, 0.9)) built with ``filter(lambda p: p.requires_grad, ...)`` for D,
``ExponentialLR(gamma=0.99)`` stepped once per epoch for both nets, both
``zero_grad()`` calls before every update, samples from a ``fixed_z`` and per-epoch
``torch.save`` of both state dicts.  Spectral norm here is the
``torch.nn.utils.parametrizations.spectral_norm`` parametrization.

What is unusual about the loop (all on purpose):
  * two optimizers stepping at a 5:1 ratio; the D loss is back-propagated through
    ``G(z)`` without detach (as in the reference code), so G accumulates gradients that
    are discarded by ``optim_gen.zero_grad()`` before the G update;
  * every D forward in train mode runs one power iteration that updates the ``_u``/``_v``
    buffers in place, and the effective weight is recomputed as ``W / sigma``; the
    largest singular value of each D layer is checked to be about 1;
  * the checkpoint is reloaded into fresh models (parametrized state dicts with
    ``original``, ``_u``, ``_v``) and compared with the live models in eval mode;
  * sampling from ``fixed_z`` runs under ``torch.random.fork_rng`` so it does not shift
    the training RNG stream; as in the reference code, G samples in train mode (batch
    statistics), which G never leaves during training.
"""
import os
import tempfile

import torch
import torch.nn as nn
import torch.optim as optim
from torch.nn.utils.parametrizations import spectral_norm
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)
Z_dim, batch_size, disc_iters, lr, channels = 32, 64, 5, 2e-4, 1
leak = 0.1


def make_glyphs(n, seed):
    """16x16 images in [-1, 1]: a bar, a vertical bar or a cross at random offsets."""
    g = torch.Generator().manual_seed(seed)
    imgs = -torch.ones(n, 1, 16, 16)
    kinds, offs = torch.randint(0, 3, (n,), generator=g), torch.randint(3, 13, (n, 2), generator=g)
    for i in range(n):
        r, c = offs[i].tolist()
        if kinds[i] in (0, 2):
            imgs[i, 0, r - 1: r + 1, 2:14] = 1.0
        if kinds[i] in (1, 2):
            imgs[i, 0, 2:14, c - 1: c + 1] = 1.0
    return imgs


class Generator(nn.Module):
    def __init__(self, z_dim):
        super().__init__()
        self.z_dim = z_dim
        self.model = nn.Sequential(
            nn.ConvTranspose2d(z_dim, 64, 4, stride=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.ConvTranspose2d(16, channels, 3, stride=1, padding=1), nn.Tanh())

    def forward(self, z):
        return self.model(z.view(-1, self.z_dim, 1, 1))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(channels, 16, 3, stride=1, padding=1))
        self.conv2 = spectral_norm(nn.Conv2d(16, 16, 4, stride=2, padding=1))
        self.conv3 = spectral_norm(nn.Conv2d(16, 32, 3, stride=1, padding=1))
        self.conv4 = spectral_norm(nn.Conv2d(32, 32, 4, stride=2, padding=1))
        self.fc = spectral_norm(nn.Linear(4 * 4 * 32, 1))

    def forward(self, x):
        m = nn.LeakyReLU(leak)(self.conv1(x))
        m = nn.LeakyReLU(leak)(self.conv2(m))
        m = nn.LeakyReLU(leak)(self.conv3(m))
        m = nn.LeakyReLU(leak)(self.conv4(m))
        return self.fc(m.view(-1, 4 * 4 * 32))


def sigma_max(module):
    w = module.weight.detach()
    return torch.linalg.matrix_norm(w.reshape(w.shape[0], -1), ord=2).item()


def main():
    loader = DataLoader(TensorDataset(make_glyphs(256, 1)), batch_size=batch_size, shuffle=True)
    discriminator, generator = Discriminator(), Generator(Z_dim)
    # the reference code filters out its non-trainable u/v; here they are buffers, the filter is harmless
    optim_disc = optim.Adam(filter(lambda p: p.requires_grad, discriminator.parameters()), lr=lr, betas=(0.0, 0.9))
    optim_gen = optim.Adam(generator.parameters(), lr=lr, betas=(0.0, 0.9))
    scheduler_d = optim.lr_scheduler.ExponentialLR(optim_disc, gamma=0.99)
    scheduler_g = optim.lr_scheduler.ExponentialLR(optim_gen, gamma=0.99)
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        fixed_z = torch.randn(batch_size, Z_dim)

    def train(epoch):
        for batch_idx, (data,) in enumerate(loader):
            if data.size()[0] != batch_size:
                continue
            for _ in range(disc_iters):
                z = torch.randn(batch_size, Z_dim)
                optim_disc.zero_grad()
                optim_gen.zero_grad()
                disc_loss = (nn.ReLU()(1.0 - discriminator(data)).mean()
                             + nn.ReLU()(1.0 + discriminator(generator(z))).mean())
                disc_loss.backward()
                optim_disc.step()
            z = torch.randn(batch_size, Z_dim)
            optim_disc.zero_grad()
            optim_gen.zero_grad()
            gen_loss = -discriminator(generator(z)).mean()
            gen_loss.backward()
            optim_gen.step()
            print(f"epoch {epoch} batch {batch_idx}: disc loss {disc_loss.item():.4f} gen loss {gen_loss.item():.4f}")
        scheduler_d.step()
        scheduler_g.step()

    def evaluate(epoch):
        with torch.no_grad(), torch.random.fork_rng():
            samples = generator(fixed_z)
        on = (samples > 0).float().mean().item()
        sig = [round(sigma_max(m), 3) for m in (discriminator.conv1, discriminator.conv2, discriminator.conv4,
                                                 discriminator.fc)]
        print(f"[eval] epoch {epoch}: fixed-z sample 'on' fraction {on:.3f} (data ~0.13), D sigma_max {sig}, "
              f"lr {scheduler_d.get_last_lr()[0]:.3e}")

    with tempfile.TemporaryDirectory() as checkpoint_dir:
        for epoch in range(3):
            train(epoch)
            evaluate(epoch)
            torch.save(discriminator.state_dict(), os.path.join(checkpoint_dir, f"disc_{epoch}"))
            torch.save(generator.state_dict(), os.path.join(checkpoint_dir, f"gen_{epoch}"))
        d2, g2 = Discriminator(), Generator(Z_dim)
        d2.load_state_dict(torch.load(os.path.join(checkpoint_dir, "disc_2")))
        g2.load_state_dict(torch.load(os.path.join(checkpoint_dir, "gen_2")))
    for m in (discriminator, generator, d2, g2):
        m.eval()
    with torch.no_grad():
        same_g = torch.equal(generator(fixed_z), g2(fixed_z))
        same_d = torch.allclose(discriminator(generator(fixed_z)), d2(g2(fixed_z)))
    print(f"checkpoint reload matches live models: generator {same_g}, discriminator {same_d}")


if __name__ == "__main__":
    main()
