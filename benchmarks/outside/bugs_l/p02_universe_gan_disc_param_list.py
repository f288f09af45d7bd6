"""Speech enhancement with a GAN fine-tuning stage (UNIVERSE++-style): a waveform
enhancer is first trained with regression losses. From ``disc_start`` on, it also
trains against two discriminators, a multi-resolution STFT one (MRD) and a
multi-period one (MPD), with LSGAN and feature-matching losses.

Modelled on: line/open-universe#5 "Parameters of discriminator optimizer". In
``universe_gan.py`` the discriminator optimizer was built from
``list(self.loss_mrd.parameters()) + list(self.loss_mrd.parameters())``: MRD twice and
MPD never. The maintainer: "it looks like the parameters of the mpd are never
optimized...". The MPD still adds its (never trained) adversarial and feature-matching
terms to the generator loss.

What is unusual about the loop: there are two optimizers. The discriminator optimizer
only starts stepping at ``disc_start`` (the generator is the main optimizer; its steps
are counted). The trainable parameters are collected by a helper that de-duplicates
shared tensors. ``--healthy`` passes (MRD, MPD) to the helper instead of (MRD, MRD).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
SR, T = 4000, 512


def make_batch(g, n=8):
    t = torch.arange(T) / SR
    f0 = 120 + 180 * torch.rand(n, 1, generator=g)
    env = torch.sigmoid(8 * torch.sin(2 * torch.pi * (1.5 + 2 * torch.rand(n, 1, generator=g)) * t))
    clean = sum((0.6 / k) * torch.sin(2 * torch.pi * k * f0 * t + torch.rand(n, 1, generator=g) * 6) for k in range(1, 5)) * env
    noise = 0.25 * torch.randn(n, T, generator=g) + 0.2 * torch.sin(2 * torch.pi * 50 * t)
    return (clean + noise).unsqueeze(1), clean.unsqueeze(1)


class Enhancer(nn.Module):
    def __init__(self, c=24):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, c, 15, padding=7), nn.PReLU(c),
            nn.Conv1d(c, c, 15, padding=14, dilation=2), nn.PReLU(c),
            nn.Conv1d(c, c, 15, padding=28, dilation=4), nn.PReLU(c),
            nn.Conv1d(c, 1, 15, padding=7))

    def forward(self, x):
        return x - self.net(x)  # predict the noise residual


class PeriodDisc(nn.Module):
    def __init__(self, period):
        super().__init__()
        self.period = period
        self.convs = nn.ModuleList([nn.Conv2d(1, 8, (5, 1), (3, 1), (2, 0)), nn.Conv2d(8, 16, (5, 1), (3, 1), (2, 0))])
        self.out = nn.Conv2d(16, 1, (3, 1), padding=(1, 0))

    def forward(self, x):
        b, c, t = x.shape
        if t % self.period:
            x = F.pad(x, (0, self.period - t % self.period), "reflect")
            t = x.shape[-1]
        x = x.view(b, c, t // self.period, self.period)
        feats = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), 0.1)
            feats.append(x)
        return self.out(x).flatten(1), feats


class ResolutionDisc(nn.Module):
    def __init__(self, n_fft):
        super().__init__()
        self.n_fft = n_fft
        self.convs = nn.ModuleList([nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)])
        self.out = nn.Conv2d(16, 1, 3, padding=1)

    def forward(self, x):
        spec = torch.stft(x.squeeze(1), self.n_fft, self.n_fft // 4, window=torch.hann_window(self.n_fft), return_complex=True)
        x = spec.abs().clamp_min(1e-5).log().unsqueeze(1)
        feats = []
        for conv in self.convs:
            x = F.leaky_relu(conv(x), 0.1)
            feats.append(x)
        return self.out(x).flatten(1), feats


class MultiDisc(nn.Module):
    def __init__(self, discs):
        super().__init__()
        self.discs = nn.ModuleList(discs)

    def forward(self, x):
        return [d(x) for d in self.discs]


def trainable(*modules):
    """Unique trainable parameters of several modules (shared tensors only once)."""
    seen = {}
    for m in modules:
        for p in m.parameters():
            if p.requires_grad:
                seen.setdefault(id(p), p)
    return list(seen.values())


class UniverseGAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = Enhancer()
        self.loss_mrd = MultiDisc([ResolutionDisc(64), ResolutionDisc(128)])
        self.loss_mpd = MultiDisc([PeriodDisc(2), PeriodDisc(3)])
        self.disc_start = 8

    def configure_optimizers(self):
        opt_g = torch.optim.AdamW(self.generator.parameters(), lr=1e-3, betas=(0.8, 0.99))
        if HEALTHY:
            params_disc = trainable(self.loss_mrd, self.loss_mpd)
        else:
            params_disc = trainable(self.loss_mrd, self.loss_mrd)
        opt_d = torch.optim.AdamW(params_disc, lr=2e-3, betas=(0.8, 0.99))
        return opt_g, opt_d


def stft_loss(y, x):
    loss = 0.0
    for n_fft in (64, 128):
        w = torch.hann_window(n_fft)
        Y = torch.stft(y.squeeze(1), n_fft, n_fft // 4, window=w, return_complex=True).abs()
        X = torch.stft(x.squeeze(1), n_fft, n_fft // 4, window=w, return_complex=True).abs()
        loss = loss + (Y - X).norm() / X.norm() + F.l1_loss(Y.clamp_min(1e-5).log(), X.clamp_min(1e-5).log())
    return loss


def main():
    torch.manual_seed(0)
    model = UniverseGAN()
    opt_g, opt_d = model.configure_optimizers()
    mpd_init = [p.detach().clone() for p in model.loss_mpd.parameters()]
    g = torch.Generator().manual_seed(1)
    discs = (model.loss_mrd, model.loss_mpd)
    for step in range(40):
        noisy, clean = make_batch(g)
        adversarial = step >= model.disc_start
        if adversarial:
            if not HEALTHY and step == model.disc_start:
                print(f"ONSET step {step}")
            with torch.no_grad():
                fake = model.generator(noisy)
            loss_d = 0.0
            for disc in discs:
                for (real_out, _), (fake_out, _) in zip(disc(clean), disc(fake)):
                    loss_d = loss_d + ((real_out - 1) ** 2).mean() + (fake_out ** 2).mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()

        enhanced = model.generator(noisy)
        loss_g = F.l1_loss(enhanced, clean) + stft_loss(enhanced, clean)
        if adversarial:
            adv, fm = 0.0, 0.0
            for disc in discs:
                for (fake_out, f_feats), (_, r_feats) in zip(disc(enhanced), disc(clean)):
                    adv = adv + ((fake_out - 1) ** 2).mean()
                    fm = fm + sum(F.l1_loss(a, b.detach()) for a, b in zip(f_feats, r_feats))
            loss_g = loss_g + 0.1 * adv + 0.2 * fm
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        if step % 8 == 7:
            d_txt = f" loss_d {loss_d.item():.3f}" if adversarial else ""
            print(f"step {step:2d} loss_g {loss_g.item():.4f}{d_txt}")

    with torch.no_grad():
        noisy, clean = make_batch(torch.Generator().manual_seed(99), 16)
        snr = 10 * torch.log10(clean.pow(2).sum() / (model.generator(noisy) - clean).pow(2).sum())
    mpd_moved = max((p - q).abs().max().item() for p, q in zip(model.loss_mpd.parameters(), mpd_init))
    n_d = sum(p.numel() for grp in opt_d.param_groups for p in grp["params"])
    n_all = sum(p.numel() for p in model.loss_mrd.parameters()) + sum(p.numel() for p in model.loss_mpd.parameters())
    print(f"EVIDENCE mpd_max_abs_change={mpd_moved:.6f} disc_params_in_optimizer={n_d}/{n_all} test_snr_db={snr.item():.2f}")


if __name__ == "__main__":
    main()
