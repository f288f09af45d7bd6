"""Energy-based generative model trained with contrastive divergence and Langevin MCMC.

Modelled on: the UvA Deep Learning course, Tutorial 8 "Deep Energy-Based Generative
Models" by Phillip Lippe (phlippe/uvadlc_notebooks, ``tutorial8/Deep_Energy_Models``,
a Lightning notebook): the ``CNNModel`` with Swish activations, the ``Sampler`` with a
replay buffer (95 % old samples, 5 % fresh uniform noise, ``max_len`` cap) and static
``generate_samples`` Langevin loop, and ``DeepEnergyModel`` with
``reg_loss = alpha * (real_out**2 + fake_out**2).mean()`` + ``cdiv_loss = fake - real``,
Adam with beta1 = 0, per-epoch StepLR(gamma=0.97), ``gradient_clip_val=0.1``.

What is unusual about the loop (all on purpose):
  * inside every ``training_step`` the model is switched to eval, all its parameters get
    ``requires_grad=False`` and 60 gradient steps are taken w.r.t. the *input images*
    (``.grad`` on inputs, clamped, in-place ``.data`` updates); the flags and the train
    mode are restored before the real forward pass;
  * the negative samples persist across steps in a replay buffer (state that is not a
    parameter, a buffer or optimizer state);
  * the real batch is perturbed in place with small noise;
  * the loss is not bounded below by the data likelihood; it can be negative and
    oscillates, which is normal for contrastive divergence;
  * validation scores real images against uniform noise; a callback generates samples
    from scratch under ``torch.random.fork_rng`` with a fixed seed, so the check is
    reproducible and leaves the training RNG stream untouched.
"""
import random

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
L.seed_everything(42, verbose=False)
IMG_SHAPE = (1, 16, 16)


def make_shapes(n, seed):
    """Toy 16x16 'glyphs' in [-1, 1]: a horizontal bar, a vertical bar or a cross at a random offset."""
    g = torch.Generator().manual_seed(seed)
    imgs = -torch.ones(n, *IMG_SHAPE)
    kinds = torch.randint(0, 3, (n,), generator=g)
    offs = torch.randint(3, 13, (n, 2), generator=g)
    for i in range(n):
        r, c = offs[i].tolist()
        if kinds[i] in (0, 2):
            imgs[i, 0, r - 1: r + 1, 2:14] = 1.0
        if kinds[i] in (1, 2):
            imgs[i, 0, 2:14, c - 1: c + 1] = 1.0
    return imgs, kinds


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class CNNModel(nn.Module):
    def __init__(self, hidden_features=16, out_dim=1):
        super().__init__()
        c1, c2, c3 = hidden_features // 2, hidden_features, hidden_features * 2
        self.cnn_layers = nn.Sequential(
            nn.Conv2d(1, c1, kernel_size=3, stride=2, padding=1), Swish(),   # 8x8
            nn.Conv2d(c1, c2, kernel_size=3, stride=2, padding=1), Swish(),  # 4x4
            nn.Conv2d(c2, c3, kernel_size=3, stride=2, padding=1), Swish(),  # 2x2
            nn.Flatten(), nn.Linear(c3 * 4, c3), Swish(), nn.Linear(c3, out_dim))

    def forward(self, x):
        return self.cnn_layers(x).squeeze(dim=-1)


class Sampler:
    def __init__(self, model, img_shape, sample_size, max_len=1024):
        self.model, self.img_shape = model, img_shape
        self.sample_size, self.max_len = sample_size, max_len
        self.examples = [(torch.rand((1,) + img_shape) * 2 - 1) for _ in range(sample_size)]

    def sample_new_exmps(self, steps=60, step_size=10):
        n_new = np.random.binomial(self.sample_size, 0.05)
        rand_imgs = torch.rand((n_new,) + self.img_shape) * 2 - 1
        old_imgs = torch.cat(random.choices(self.examples, k=self.sample_size - n_new), dim=0)
        inp_imgs = torch.cat([rand_imgs, old_imgs], dim=0).detach()
        inp_imgs = Sampler.generate_samples(self.model, inp_imgs, steps=steps, step_size=step_size)
        self.examples = list(inp_imgs.chunk(self.sample_size, dim=0)) + self.examples
        self.examples = self.examples[: self.max_len]
        return inp_imgs

    @staticmethod
    def generate_samples(model, inp_imgs, steps=60, step_size=10):
        is_training = model.training
        model.eval()
        for p in model.parameters():
            p.requires_grad = False
        inp_imgs.requires_grad = True
        had_gradients_enabled = torch.is_grad_enabled()
        torch.set_grad_enabled(True)
        noise = torch.randn(inp_imgs.shape)
        for _ in range(steps):
            noise.normal_(0, 0.005)
            inp_imgs.data.add_(noise.data)
            inp_imgs.data.clamp_(min=-1.0, max=1.0)
            out_imgs = -model(inp_imgs)
            out_imgs.sum().backward()
            inp_imgs.grad.data.clamp_(-0.03, 0.03)
            inp_imgs.data.add_(-step_size * inp_imgs.grad.data)
            inp_imgs.grad.detach_()
            inp_imgs.grad.zero_()
            inp_imgs.data.clamp_(min=-1.0, max=1.0)
        for p in model.parameters():
            p.requires_grad = True
        model.train(is_training)
        torch.set_grad_enabled(had_gradients_enabled)
        return inp_imgs.detach()


class DeepEnergyModel(L.LightningModule):
    def __init__(self, img_shape, batch_size, alpha=0.1, lr=1e-3, beta1=0.0, mcmc_steps=60):
        super().__init__()
        self.save_hyperparameters()
        self.cnn = CNNModel()
        self.sampler = Sampler(self.cnn, img_shape=img_shape, sample_size=batch_size)

    def forward(self, x):
        return self.cnn(x)

    def configure_optimizers(self):
        optimizer = optim.Adam(self.parameters(), lr=self.hparams.lr, betas=(self.hparams.beta1, 0.999))
        scheduler = optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.97)
        return [optimizer], [scheduler]

    def training_step(self, batch, batch_idx):
        real_imgs, _ = batch
        small_noise = torch.randn_like(real_imgs) * 0.005
        real_imgs.add_(small_noise).clamp_(min=-1.0, max=1.0)
        fake_imgs = self.sampler.sample_new_exmps(steps=self.hparams.mcmc_steps, step_size=10)
        inp_imgs = torch.cat([real_imgs, fake_imgs], dim=0)
        real_out, fake_out = self.cnn(inp_imgs).chunk(2, dim=0)
        reg_loss = self.hparams.alpha * (real_out ** 2 + fake_out ** 2).mean()
        cdiv_loss = fake_out.mean() - real_out.mean()
        loss = reg_loss + cdiv_loss
        self.log_dict({"loss": loss, "loss_regularization": reg_loss, "loss_contrastive_divergence": cdiv_loss,
                       "metrics_avg_real": real_out.mean(), "metrics_avg_fake": fake_out.mean()}, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        real_imgs, _ = batch
        fake_imgs = torch.rand_like(real_imgs) * 2 - 1
        real_out, fake_out = self.cnn(torch.cat([real_imgs, fake_imgs], dim=0)).chunk(2, dim=0)
        self.log_dict({"val_contrastive_divergence": fake_out.mean() - real_out.mean(),
                       "val_fake_out": fake_out.mean(), "val_real_out": real_out.mean()})


class GenerateCallback(L.Callback):
    """Runs a fresh chain from uniform noise with a fixed seed at each epoch end."""

    def __init__(self, batch_size=16, steps=60, seed=7):
        self.batch_size, self.steps, self.seed = batch_size, steps, seed

    def on_train_epoch_end(self, trainer, pl_module):
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            start = torch.rand((self.batch_size,) + IMG_SHAPE) * 2 - 1
            imgs = Sampler.generate_samples(pl_module.cnn, start, steps=self.steps, step_size=10)
        with torch.no_grad():
            energy = -pl_module.cnn(imgs).mean()
        bright = (imgs > 0).float().mean()
        print(f"[generate] epoch {trainer.current_epoch}: energy of fixed-seed samples {energy:.3f}, "
              f"fraction of 'on' pixels {bright:.3f}")


def main():
    batch_size = 32
    train_x, train_y = make_shapes(320, seed=1)
    val_x, val_y = make_shapes(96, seed=2)
    train_loader = DataLoader(TensorDataset(train_x, train_y), batch_size=batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(TensorDataset(val_x, val_y), batch_size=batch_size)
    model = DeepEnergyModel(img_shape=IMG_SHAPE, batch_size=batch_size)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, gradient_clip_val=0.1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[GenerateCallback()])
    trainer.fit(model, train_loader, val_loader)
    print(f"global steps {trainer.global_step}, buffer size {len(model.sampler.examples)}, "
          f"metrics { {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()} }")


if __name__ == "__main__":
    main()
