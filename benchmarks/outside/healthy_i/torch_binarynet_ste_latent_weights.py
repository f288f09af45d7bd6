"""Binarized neural network (BNN) with latent real-valued weights and an STE.

Modelled on: itayhubara/BinaryNet.pytorch (Hubara, Courbariaux et al., "Binarized
Neural Networks", NeurIPS 2016): ``models/binarized_modules.py`` (``BinarizeLinear``
keeps the real weights in ``self.weight.org`` and overwrites ``self.weight.data``
with their sign before every forward) and ``main_mnist.py`` (before
``optimizer.step()`` the real weights are copied back into ``p.data``; after the
step they are clipped to [-1, 1] and stored again in ``p.org``).

What is unusual about the loop (all intentional):
  * ``p.data`` of the binarized layers alternates between sign(w) during
    forward/backward and the latent real weights w during the optimizer step,
    i.e. the parameter tensor is overwritten by hand twice per step;
  * the latent weights are hard-clipped to [-1, 1] after each step;
  * activations are binarized by a custom ``torch.autograd.Function`` whose
    backward is the straight-through estimator (gradient passed where |x| <= 1);
  * the first layer's input and the last layer's output are kept real-valued,
    as in the paper; BatchNorm after every binarized layer.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class SignSTE(torch.autograd.Function):
    """sign(x) in the forward pass, hard-tanh gradient in the backward pass."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * (x.abs() <= 1).to(grad_output.dtype)


def binarize(t):
    return torch.where(t >= 0, torch.ones_like(t), -torch.ones_like(t))


class BinarizeLinear(nn.Linear):
    def __init__(self, *args, binarize_input=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.binarize_input = binarize_input

    def forward(self, x):
        if self.binarize_input:
            x = SignSTE.apply(x)
        if not hasattr(self.weight, "org"):
            self.weight.org = self.weight.data.clone()
        self.weight.data = binarize(self.weight.org)
        out = F.linear(x, self.weight)
        if self.bias is not None:
            out = out + self.bias.view(1, -1)
        return out


class BNNMLP(nn.Module):
    def __init__(self, in_dim=64, hidden=256, n_classes=10):
        super().__init__()
        self.fc1 = BinarizeLinear(in_dim, hidden, binarize_input=False)
        self.bn1 = nn.BatchNorm1d(hidden)
        self.fc2 = BinarizeLinear(hidden, hidden)
        self.bn2 = nn.BatchNorm1d(hidden)
        self.fc3 = BinarizeLinear(hidden, n_classes)
        self.bn3 = nn.BatchNorm1d(n_classes)

    def forward(self, x):
        x = F.hardtanh(self.bn1(self.fc1(x)))
        x = F.hardtanh(self.bn2(self.fc2(x)))
        return self.bn3(self.fc3(x))


def make_data(n, gen):
    protos = torch.randn(10, 64, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, 10, (n,), generator=gen)
    x = protos[y] + 2.0 * torch.randn(n, 64, generator=gen)
    return x, y


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(-1) == y).float().mean().item()
    model.train()
    return acc


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x_train, y_train = make_data(3840, gen)
    x_test, y_test = make_data(1000, gen)

    model = BNNMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[40, 55], gamma=0.3)
    criterion = nn.CrossEntropyLoss()

    batch_size, epochs = 128, 2
    n_batches = x_train.shape[0] // batch_size
    t0 = time.time()
    step = 0
    for epoch in range(epochs):
        perm = torch.randperm(x_train.shape[0], generator=gen)
        for i in range(n_batches):
            idx = perm[i * batch_size:(i + 1) * batch_size]
            output = model(x_train[idx])
            loss = criterion(output, y_train[idx])

            optimizer.zero_grad()
            loss.backward()
            # restore the latent real-valued weights before the update ...
            for p in model.parameters():
                if hasattr(p, "org"):
                    p.data.copy_(p.org)
            optimizer.step()
            # ... and clip them to [-1, 1] and keep them as the new latent weights
            for p in model.parameters():
                if hasattr(p, "org"):
                    p.org.copy_(p.data.clamp_(-1, 1))
            scheduler.step()
            step += 1
            if step % 10 == 0:
                print(f"step {step:3d} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                      f"test acc {evaluate(model, x_test, y_test):.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
