"""Glow normalizing flow on tiny synthetic 8x8 images, trained with Lightning.

Modelled on: rosinality/glow-pytorch (``model.py``: ``ActNorm`` with an ``initialized`` buffer and
data-dependent initialisation on the first forward, ``InvConv2dLU`` with the LU decomposition of a
random rotation, fixed ``w_p``/``s_sign``/mask buffers and ``w_s`` stored as log|s|,
``ZeroConv2d`` (zero weights, output scaled by exp(3 * scale)), ``AffineCoupling`` with
sigmoid(log_s + 2), a learned prior from ``ZeroConv2d`` on zeros; ``train.py``: n_bits
quantisation + uniform dequantisation, ``calc_loss`` in bits per dimension, the first iteration
only runs the model under ``torch.no_grad()`` to initialise ActNorm and then ``continue``s, and
a fixed ``z_sample`` drawn once at temperature 0.7 is decoded for samples).

Unusual but correct: the first training batch does no optimizer step (``training_step`` returns
None after the data-dependent init, which Lightning treats as "skip this batch"); ActNorm's loc and
scale are overwritten with ``.data.copy_`` under no_grad at that point; the coupling layers' last
convs start at exactly zero (so the flow starts as ActNorm + 1x1 conv only and the first
gradients of the inner coupling convs are zero); validation runs twice in the middle of the epoch
with dequantisation noise from a fixed-seed generator so the bpd numbers are comparable.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning.pytorch as pl

torch.set_num_threads(1)

logabs = lambda x: torch.log(torch.abs(x))
N_BITS = 5
N_BINS = 2.0 ** N_BITS


class ActNorm(nn.Module):
    def __init__(self, in_channel):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, in_channel, 1, 1))
        self.scale = nn.Parameter(torch.ones(1, in_channel, 1, 1))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def initialize(self, input):
        with torch.no_grad():
            flatten = input.permute(1, 0, 2, 3).contiguous().view(input.shape[1], -1)
            mean = flatten.mean(1).view(1, -1, 1, 1)
            std = flatten.std(1).view(1, -1, 1, 1)
            self.loc.data.copy_(-mean)
            self.scale.data.copy_(1 / (std + 1e-6))

    def forward(self, input):
        _, _, height, width = input.shape
        if self.initialized.item() == 0:
            self.initialize(input)
            self.initialized.fill_(1)
        logdet = height * width * torch.sum(logabs(self.scale))
        return self.scale * (input + self.loc), logdet

    def reverse(self, output):
        return output / self.scale - self.loc


class InvConv2dLU(nn.Module):
    def __init__(self, in_channel, generator):
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(in_channel, in_channel, generator=generator))
        w_p, w_l, w_u = torch.linalg.lu(q)
        w_s = torch.diag(w_u)
        u_mask = torch.triu(torch.ones_like(w_u), 1)
        self.register_buffer("w_p", w_p)
        self.register_buffer("u_mask", u_mask)
        self.register_buffer("l_mask", u_mask.T.contiguous())
        self.register_buffer("s_sign", torch.sign(w_s))
        self.register_buffer("l_eye", torch.eye(in_channel))
        self.w_l = nn.Parameter(w_l)
        self.w_s = nn.Parameter(logabs(w_s))
        self.w_u = nn.Parameter(torch.triu(w_u, 1))

    def calc_weight(self):
        weight = self.w_p @ (self.w_l * self.l_mask + self.l_eye) @ (
            self.w_u * self.u_mask + torch.diag(self.s_sign * torch.exp(self.w_s)))
        return weight.unsqueeze(2).unsqueeze(3)

    def forward(self, input):
        _, _, height, width = input.shape
        return F.conv2d(input, self.calc_weight()), height * width * torch.sum(self.w_s)

    def reverse(self, output):
        weight = self.calc_weight()
        return F.conv2d(output, weight.squeeze().inverse().unsqueeze(2).unsqueeze(3))


class ZeroConv2d(nn.Module):
    def __init__(self, in_channel, out_channel):
        super().__init__()
        self.conv = nn.Conv2d(in_channel, out_channel, 3, padding=0)
        self.conv.weight.data.zero_()
        self.conv.bias.data.zero_()
        self.scale = nn.Parameter(torch.zeros(1, out_channel, 1, 1))

    def forward(self, input):
        out = self.conv(F.pad(input, [1, 1, 1, 1], value=1))
        return out * torch.exp(self.scale * 3)


class AffineCoupling(nn.Module):
    def __init__(self, in_channel, filter_size=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channel // 2, filter_size, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(filter_size, filter_size, 1), nn.ReLU(inplace=True),
            ZeroConv2d(filter_size, in_channel))
        for i in (0, 2):
            self.net[i].weight.data.normal_(0, 0.05)
            self.net[i].bias.data.zero_()

    def forward(self, input):
        in_a, in_b = input.chunk(2, 1)
        log_s, t = self.net(in_a).chunk(2, 1)
        s = torch.sigmoid(log_s + 2)
        out_b = (in_b + t) * s
        logdet = torch.sum(torch.log(s).view(input.shape[0], -1), 1)
        return torch.cat([in_a, out_b], 1), logdet

    def reverse(self, output):
        out_a, out_b = output.chunk(2, 1)
        log_s, t = self.net(out_a).chunk(2, 1)
        s = torch.sigmoid(log_s + 2)
        return torch.cat([out_a, out_b / s - t], 1)


class Flow(nn.Module):
    def __init__(self, in_channel, generator):
        super().__init__()
        self.actnorm = ActNorm(in_channel)
        self.invconv = InvConv2dLU(in_channel, generator)
        self.coupling = AffineCoupling(in_channel)

    def forward(self, input):
        out, logdet = self.actnorm(input)
        out, det1 = self.invconv(out)
        out, det2 = self.coupling(out)
        return out, logdet + det1 + det2

    def reverse(self, output):
        return self.actnorm.reverse(self.invconv.reverse(self.coupling.reverse(output)))


def gaussian_log_p(x, mean, log_sd):
    return -0.5 * math.log(2 * math.pi) - log_sd - 0.5 * (x - mean) ** 2 / torch.exp(2 * log_sd)


class Glow(nn.Module):
    """One squeeze + K flows + learned prior (a single block, no split)."""

    def __init__(self, in_channel=1, n_flow=6, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.flows = nn.ModuleList([Flow(in_channel * 4, g) for _ in range(n_flow)])
        self.prior = ZeroConv2d(in_channel * 4, in_channel * 8)

    def forward(self, input):
        b, c, h, w = input.shape
        out = input.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).contiguous()
        out = out.view(b, c * 4, h // 2, w // 2)
        logdet = 0
        for flow in self.flows:
            out, det = flow(out)
            logdet = logdet + det
        mean, log_sd = self.prior(torch.zeros_like(out)).chunk(2, 1)
        log_p = gaussian_log_p(out, mean, log_sd).view(b, -1).sum(1)
        return log_p, logdet, out

    def reverse(self, eps):
        """Decode latent noise eps (already multiplied by the temperature) into images."""
        mean, log_sd = self.prior(torch.zeros_like(eps)).chunk(2, 1)
        x = mean + torch.exp(log_sd) * eps
        for flow in self.flows[::-1]:
            x = flow.reverse(x)
        b, c4, h2, w2 = x.shape
        x = x.view(b, c4 // 4, 2, 2, h2, w2).permute(0, 1, 4, 2, 5, 3).contiguous()
        return x.view(b, c4 // 4, h2 * 2, w2 * 2)


def calc_loss(log_p, logdet, n_pixel):
    loss = -math.log(N_BINS) * n_pixel + logdet + log_p
    return (-loss / (math.log(2) * n_pixel)).mean()


class GlowModule(pl.LightningModule):
    def __init__(self, lr=1e-3, temp=0.7, n_sample=16):
        super().__init__()
        self.save_hyperparameters()
        self.glow = Glow()
        # fixed latent noise for samples, drawn once, as in train.py
        self.register_buffer("z_sample", torch.randn(n_sample, 4, 4, 4, generator=torch.Generator().manual_seed(1)) * temp)

    def training_step(self, batch, batch_idx):
        image = batch[0]
        dequant = image + torch.rand_like(image) / N_BINS
        if self.glow.flows[0].actnorm.initialized.item() == 0:
            with torch.no_grad():
                self.glow(dequant)          # data-dependent ActNorm init; no update on this batch
            return None
        log_p, logdet, _ = self.glow(dequant)
        loss = calc_loss(log_p, logdet, image[0].numel())
        self.log("train_bpd", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        image = batch[0]
        g = torch.Generator().manual_seed(1234 + batch_idx)     # same dequantisation every eval
        noise = torch.rand(image.shape, generator=g) / N_BINS
        log_p, logdet, _ = self.glow(image + noise)
        self.log("val_bpd", calc_loss(log_p, logdet, image[0].numel()))

    def on_validation_epoch_end(self):
        if self.glow.flows[0].actnorm.initialized.item():
            with torch.no_grad():
                samples = self.glow.reverse(self.z_sample)
            print(f"step {self.global_step}: val_bpd {float(self.trainer.callback_metrics['val_bpd']):.3f}, "
                  f"sample mean {samples.mean().item():+.3f}, std {samples.std().item():.3f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def make_images(n, seed):
    """8x8 grey images: a bright square on a vertical gradient, quantised to N_BITS, in [-0.5, 0.5)."""
    g = np.random.default_rng(seed)
    img = np.tile(np.linspace(0.1, 0.4, 8)[:, None], (n, 1, 1, 8)).astype(np.float32)
    for i in range(n):
        r, c, s = g.integers(0, 5), g.integers(0, 5), g.integers(2, 4)
        img[i, 0, r:r + s, c:c + s] = 0.9
    img = np.clip(img + 0.05 * g.standard_normal(img.shape), 0, 0.999)
    img = np.floor(img * N_BINS) / N_BINS - 0.5
    return torch.utils.data.TensorDataset(torch.from_numpy(img.astype(np.float32)))


def main():
    pl.seed_everything(0)
    train_dl = torch.utils.data.DataLoader(make_images(32 * 52, 0), batch_size=32, shuffle=True)
    val_dl = torch.utils.data.DataLoader(make_images(256, 1), batch_size=128)
    model = GlowModule()
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, val_check_interval=26, num_sanity_val_steps=0)
    trainer.fit(model, train_dataloaders=train_dl, val_dataloaders=val_dl)
    opt = trainer.optimizers[0]
    adam_steps = int(opt.state[opt.param_groups[0]["params"][0]]["step"])
    print(f"52 batches, trainer.global_step={trainer.global_step}, Adam updates={adam_steps} "
          f"(the first batch only initialised ActNorm)")
    assert math.isfinite(float(trainer.callback_metrics["val_bpd"]))


if __name__ == "__main__":
    main()
