"""2x super-resolution GAN (SRGAN-style) in Lightning with manual optimization and two StepLR schedulers.

Modelled on: Lightning-AI/pytorch-lightning#17738 "The learning rate adjustment problem when
self.automatic_optimization=False" -- an SRGAN trained with manual optimization returned its
schedulers from ``configure_optimizers`` with ``"interval": "epoch"`` and called ``sch.step()``
inside ``training_step`` as in the manual-optimization example, but "found that this did not
work and the learning rate remained at batch step as the interval update".  In manual
optimization Lightning ignores the ``interval`` / ``frequency`` keys; whatever calls
``scheduler.step()`` decides the cadence.  The fix is to step epoch-based schedulers once per
epoch (e.g. in ``on_train_epoch_end`` or when ``self.trainer.is_last_batch``).

What is unusual about the loop: generator and discriminator are optimized by hand in one
``training_step`` (discriminator first, then generator with content + adversarial loss); the
generator optimizer is the main optimizer.  StepLR(step_size=6) was meant as "halve every six
epochs", so the first six generator steps are fine in both variants.  ``--healthy`` steps the
schedulers in ``on_train_epoch_end`` (the fix).
"""
import argparse
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def make_textures(n, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    img = torch.zeros(n, 3, size, size)
    for _ in range(4):
        f = 1 + 6 * torch.rand(n, 1, 1, 1, generator=g)
        th = math.pi * torch.rand(n, 1, 1, 1, generator=g)
        ph = 2 * math.pi * torch.rand(n, 1, 1, 1, generator=g)
        col = torch.rand(n, 3, 1, 1, generator=g)
        img = img + col * torch.sin(2 * math.pi * f * (xx * torch.cos(th) + yy * torch.sin(th)) + ph)
    hr = torch.tanh(img / 2)
    lr = F.avg_pool2d(hr, 2)
    return lr, hr


class ResidualBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.PReLU(),
                                  nn.Conv2d(ch, ch, 3, padding=1), nn.BatchNorm2d(ch))

    def forward(self, x):
        return x + self.body(x)


class Generator(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(3, ch, 5, padding=2), nn.PReLU())
        self.blocks = nn.Sequential(ResidualBlock(ch), ResidualBlock(ch))
        self.up = nn.Sequential(nn.Conv2d(ch, 4 * ch, 3, padding=1), nn.PixelShuffle(2), nn.PReLU())
        self.tail = nn.Conv2d(ch, 3, 5, padding=2)

    def forward(self, x):
        h = self.head(x)
        return torch.tanh(self.tail(self.up(h + self.blocks(h))))


class Discriminator(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, ch, 3, padding=1), nn.LeakyReLU(0.2),
            nn.Conv2d(ch, ch, 3, stride=2, padding=1), nn.BatchNorm2d(ch), nn.LeakyReLU(0.2),
            nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.BatchNorm2d(2 * ch), nn.LeakyReLU(0.2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * ch, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class SRGAN(L.LightningModule):
    def __init__(self, healthy, lr_g=1e-3, lr_d=1e-3, adv_weight=1e-2):
        super().__init__()
        self.automatic_optimization = False
        self.healthy, self.lr_g, self.lr_d, self.adv_weight = healthy, lr_g, lr_d, adv_weight
        self.generator, self.discriminator = Generator(), Discriminator()
        self.g_steps, self.lr_history = 0, []

    def training_step(self, batch, batch_idx):
        lr_img, hr_img = batch
        opt_g, opt_d = self.optimizers()
        sch_g, sch_d = self.lr_schedulers()

        fake = self.generator(lr_img)
        d_real, d_fake = self.discriminator(hr_img), self.discriminator(fake.detach())
        loss_d = (F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                  + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake)))
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()

        d_fake = self.discriminator(fake)
        content = F.mse_loss(fake, hr_img)
        adversarial = F.binary_cross_entropy_with_logits(d_fake, torch.ones_like(d_fake))
        loss_g = content + self.adv_weight * adversarial
        self.lr_history.append(opt_g.param_groups[0]["lr"])
        opt_g.zero_grad()
        self.manual_backward(loss_g)
        opt_g.step()
        self.g_steps += 1

        if not self.healthy:
            sch_g.step()
            sch_d.step()
        if batch_idx == 0:
            psnr = 10 * torch.log10(4.0 / content.detach())
            print(f"epoch {self.current_epoch} g_step {self.g_steps - 1} loss_d {loss_d.item():.4f} "
                  f"content {content.item():.5f} psnr {psnr.item():.2f} lr_g {self.lr_history[-1]:.2e}")

    def on_train_epoch_end(self):
        if self.healthy:
            for sch in self.lr_schedulers():
                sch.step()

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.lr_g, betas=(0.9, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.lr_d, betas=(0.9, 0.999))
        sch_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=6, gamma=0.5)
        sch_d = torch.optim.lr_scheduler.StepLR(opt_d, step_size=6, gamma=0.5)
        return ([opt_g, opt_d],
                [{"scheduler": sch_g, "interval": "epoch"}, {"scheduler": sch_d, "interval": "epoch"}])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--epochs", type=int, default=8)
    args = p.parse_args()

    L.seed_everything(0, verbose=False)
    lr_img, hr_img = make_textures(80)
    loader = DataLoader(TensorDataset(lr_img, hr_img), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = SRGAN(args.healthy)
    if not args.healthy:
        print("ONSET step 6")  # StepLR(step_size=6) is stepped once per batch
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)

    h = model.lr_history
    print(f"EVIDENCE generator lr at g_step 6 {h[6]:.2e}, at g_step 30 {h[30]:.2e}, at last g_step "
          f"{h[-1]:.2e} ({len(h)} generator steps; epoch-wise StepLR(6) expects 1.00e-03 until step 30)")


if __name__ == "__main__":
    main()
