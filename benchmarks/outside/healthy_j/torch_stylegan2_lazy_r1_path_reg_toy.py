"""StyleGAN2-style training loop on a 2-D toy distribution (noisy ring).

Modelled on: rosinality/stylegan2-pytorch ``train.py`` and ``op/fused_act.py``
(``requires_grad(model, flag)`` toggling, non-saturating logistic losses, lazy R1
regularisation every ``d_reg_every`` iterations with its own extra ``d_optim.step()``,
lazy path-length regularisation every ``g_reg_every`` iterations, ``accumulate(g_ema,
generator)`` with ``g_ema`` initialised by ``accumulate(g_ema, generator, 0)``, Adam with
``lr * reg_ratio`` and ``betas=(0 ** reg_ratio, 0.99 ** reg_ratio)``, ``EqualLinear``
with ``lr_mul`` in the mapping network, and ``FusedLeakyReLU`` written as a custom
autograd Function whose backward is itself a Function so that R1 can double-backward
through it).  The image CNNs are replaced by MLPs on 2-D points.

What is unusual about the loop:
  * The discriminator optimizer steps twice on regularisation iterations (once for the
    logistic loss, once for ``r1 / 2 * r1_loss * d_reg_every``), and the generator
    optimizer steps twice on path-length iterations; R1 and path length use
    ``autograd.grad(..., create_graph=True)``.
  * Adam's beta1 is exactly 0 and the learning rate is scaled by the lazy-reg ratio.
  * Parameters have their ``requires_grad`` flag flipped every iteration, so half of the
    model gets no gradients in each phase.
  * ``EqualLinear`` stores ``randn / lr_mul`` and rescales at run time (equalised lr),
    so the mapping-net weights are stored ~100x larger than they act.
  * A custom double-differentiable autograd Function (``FusedLeakyReLU``), checked with
    ``gradcheck``/``gradgradcheck`` at start-up.
  * ``g_ema`` is an exponential moving average that never gets gradients; samples for
    evaluation come from a fixed ``sample_z`` drawn once from a seeded generator.
"""
import math
import random

import torch
from torch import autograd, nn, optim
from torch.autograd import Function
from torch.nn import functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)


class FusedLeakyReLUFunctionBackward(Function):
    @staticmethod
    def forward(ctx, grad_output, out, negative_slope, scale):
        mask = torch.where(out > 0, scale, negative_slope * scale).to(grad_output.dtype)
        ctx.save_for_backward(mask)
        grad_input = grad_output * mask
        grad_bias = grad_input.sum(dim=0)
        return grad_input, grad_bias

    @staticmethod
    def backward(ctx, gradgrad_input, gradgrad_bias):
        (mask,) = ctx.saved_tensors
        gradgrad_out = (gradgrad_input + gradgrad_bias.unsqueeze(0)) * mask
        return gradgrad_out, None, None, None


class FusedLeakyReLUFunction(Function):
    @staticmethod
    def forward(ctx, inp, bias, negative_slope, scale):
        out = F.leaky_relu(inp + bias.unsqueeze(0), negative_slope) * scale
        ctx.save_for_backward(out)
        ctx.negative_slope = negative_slope
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (out,) = ctx.saved_tensors
        grad_input, grad_bias = FusedLeakyReLUFunctionBackward.apply(
            grad_output, out, ctx.negative_slope, ctx.scale)
        return grad_input, grad_bias, None, None


def fused_leaky_relu(inp, bias, negative_slope=0.2, scale=2 ** 0.5):
    return FusedLeakyReLUFunction.apply(inp, bias, negative_slope, scale)


class EqualLinear(nn.Module):
    def __init__(self, in_dim, out_dim, bias_init=0.0, lr_mul=1.0, activation=False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_dim, in_dim).div_(lr_mul))
        self.bias = nn.Parameter(torch.zeros(out_dim).fill_(bias_init))
        self.activation = activation
        self.scale = (1 / math.sqrt(in_dim)) * lr_mul
        self.lr_mul = lr_mul

    def forward(self, x):
        if self.activation:
            out = F.linear(x, self.weight * self.scale)
            return fused_leaky_relu(out, self.bias * self.lr_mul)
        return F.linear(x, self.weight * self.scale, bias=self.bias * self.lr_mul)


class Generator(nn.Module):
    def __init__(self, latent=16, n_mlp=4, hidden=64, lr_mlp=0.01):
        super().__init__()
        layers = [EqualLinear(latent, latent, lr_mul=lr_mlp, activation=True) for _ in range(n_mlp)]
        self.style = nn.Sequential(*layers)
        self.synthesis = nn.Sequential(
            EqualLinear(latent, hidden, activation=True),
            EqualLinear(hidden, hidden, activation=True),
            EqualLinear(hidden, 2),
        )

    def forward(self, z, return_latents=False):
        z = z * torch.rsqrt(z.pow(2).mean(dim=1, keepdim=True) + 1e-8)  # PixelNorm
        w = self.style(z)
        x = self.synthesis(w)
        return (x, w) if return_latents else (x, None)


class Discriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            EqualLinear(2, hidden, activation=True),
            EqualLinear(hidden, hidden, activation=True),
            EqualLinear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag


def accumulate(model1, model2, decay=0.999):
    par1 = dict(model1.named_parameters())
    par2 = dict(model2.named_parameters())
    for k in par1.keys():
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def d_logistic_loss(real_pred, fake_pred):
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred, real_img):
    (grad_real,) = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


def g_nonsaturating_loss(fake_pred):
    return F.softplus(-fake_pred).mean()


def g_path_regularize(fake_img, latents, mean_path_length, decay=0.01):
    noise = torch.randn_like(fake_img) / math.sqrt(fake_img.shape[1])
    (grad,) = autograd.grad(outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True)
    path_lengths = torch.sqrt(grad.pow(2).sum(1))
    path_mean = mean_path_length + decay * (path_lengths.detach().mean() - mean_path_length)
    path_penalty = (path_lengths - path_mean).pow(2).mean()
    return path_penalty, path_mean.detach()


def sample_ring(n, g=None):
    theta = torch.rand(n, generator=g) * 2 * math.pi
    r = 2.0 + 0.1 * torch.randn(n, generator=g)
    return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1)


def mmd_rbf(x, y, sigma=1.0):
    def k(a, b):
        return torch.exp(-torch.cdist(a, b).pow(2) / (2 * sigma ** 2))
    return (k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean()).item()


def main():
    x64 = torch.randn(6, 5, dtype=torch.double, requires_grad=True)
    b64 = torch.randn(5, dtype=torch.double, requires_grad=True)
    fn = lambda a, b: fused_leaky_relu(a, b)  # noqa: E731
    assert autograd.gradcheck(fn, (x64, b64)) and autograd.gradgradcheck(fn, (x64, b64))

    iters, batch, latent, lr = 60, 128, 16, 0.01
    r1, path_regularize, d_reg_every, g_reg_every = 1.0, 0.5, 16, 4

    generator, discriminator, g_ema = Generator(latent), Discriminator(), Generator(latent)
    g_ema.eval()
    requires_grad(g_ema, False)
    accumulate(g_ema, generator, 0)

    g_reg_ratio = g_reg_every / (g_reg_every + 1)
    d_reg_ratio = d_reg_every / (d_reg_every + 1)
    g_optim = optim.Adam(generator.parameters(), lr=lr * g_reg_ratio,
                         betas=(0 ** g_reg_ratio, 0.99 ** g_reg_ratio))
    d_optim = optim.Adam(discriminator.parameters(), lr=lr * d_reg_ratio,
                         betas=(0 ** d_reg_ratio, 0.99 ** d_reg_ratio))

    data_gen = torch.Generator().manual_seed(1)
    sample_z = torch.randn(1024, latent, generator=torch.Generator().manual_seed(2))
    eval_real = sample_ring(1024, torch.Generator().manual_seed(3))
    ema_kimg = 0.5  # half-life of g_ema in thousands of samples (rosinality uses 10)
    ema_decay = 0.5 ** (batch / (ema_kimg * 1000))
    mean_path_length = torch.tensor(0.0)
    r1_loss = path_loss = torch.tensor(0.0)

    for i in range(iters):
        real_img = sample_ring(batch, data_gen)

        requires_grad(generator, False)
        requires_grad(discriminator, True)
        noise = torch.randn(batch, latent)
        fake_img, _ = generator(noise)
        fake_pred = discriminator(fake_img)
        real_pred = discriminator(real_img)
        d_loss = d_logistic_loss(real_pred, fake_pred)
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()

        if i % d_reg_every == 0:
            real_img.requires_grad = True
            real_pred = discriminator(real_img)
            r1_loss = d_r1_loss(real_pred, real_img)
            discriminator.zero_grad()
            (r1 / 2 * r1_loss * d_reg_every).backward()
            d_optim.step()

        requires_grad(generator, True)
        requires_grad(discriminator, False)
        noise = torch.randn(batch, latent)
        fake_img, _ = generator(noise)
        fake_pred = discriminator(fake_img)
        g_loss = g_nonsaturating_loss(fake_pred)
        generator.zero_grad()
        g_loss.backward()
        g_optim.step()

        if i % g_reg_every == 0:
            path_batch = max(1, batch // 2)
            noise = torch.randn(path_batch, latent)
            fake_img, latents = generator(noise, return_latents=True)
            path_loss, mean_path_length = g_path_regularize(fake_img, latents, mean_path_length)
            generator.zero_grad()
            (path_regularize * g_reg_every * path_loss).backward()
            g_optim.step()

        accumulate(g_ema, generator, ema_decay)

        if i % 15 == 0 or i == iters - 1:
            with torch.no_grad():
                sample, _ = g_ema(sample_z)
                cur, _ = generator(sample_z)
            print(f"iter {i:3d} d {d_loss.item():.4f} g {g_loss.item():.4f} r1 {r1_loss.item():.4f} "
                  f"path {path_loss.item():.4f} mean_path {mean_path_length.item():.4f} "
                  f"mmd(G) {mmd_rbf(cur, eval_real):.4f} mmd(G_ema) {mmd_rbf(sample, eval_real):.4f}")


if __name__ == "__main__":
    main()
