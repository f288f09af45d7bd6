"""Dynamic sparse training with RigL (drop by magnitude, regrow by dense-gradient magnitude).

Modelled on: verbose-void/rigl-torch (formerly McCrearyD/rigl-torch; ``rigl_torch/RigL.py`` and
``train_mnist_rigl.py``), the PyTorch port of google-research/rigl (Evci, Gale, Menick, Castro &
Elsen, "Rigging the Lottery: Making All Tickets Winners", ICML 2020).

What is unusual about the loop (deliberate):
  * Every sparse weight tensor carries a tensor hook that *edits its gradient*: it keeps a copy
    of the dense gradient (needed to score growth candidates) and returns ``grad * mask`` so
    pruned connections never receive an update.
  * Every ``delta`` steps (until ``T_end``) the topology is changed instead of taking an
    optimizer step: the scheduler's ``__call__`` returns False and ``optimizer.step()`` is
    skipped on purpose, exactly like ``if pruner(): optimizer.step()`` in the original.
  * Newly grown connections are written into the weights as exact zeros and their SGD momentum
    buffers are masked; an optimizer step post-hook re-applies masks after every step.
  * The drop fraction follows a cosine decay; first layer stays dense (uniform distribution).
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class IndexMaskHook:
    def __init__(self, layer, scheduler):
        self.layer = layer
        self.scheduler = scheduler
        self.dense_grad = None

    @torch.no_grad()
    def __call__(self, grad):
        mask = self.scheduler.backward_masks[self.layer]
        if self.scheduler.next_step_is_rigl():
            self.dense_grad = grad.clone()
        return grad * mask


class RigLScheduler:
    def __init__(self, model, optimizer, dense_allocation=0.2, T_end=None, delta=10, alpha=0.3):
        self.model, self.optimizer = model, optimizer
        weights = [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        self.W = weights[1:]  # uniform distribution: the first layer stays dense
        self.S = [1 - dense_allocation] * len(self.W)
        self.N = [w.numel() for w in self.W]
        self.step, self.rigl_steps = 0, 0
        self.delta_T, self.alpha, self.T_end = delta, alpha, T_end
        self.random_sparsify()
        self.hooks = []
        for i, w in enumerate(self.W):
            self.hooks.append(IndexMaskHook(i, self))
            w.register_hook(self.hooks[-1])
        optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_step())

    @torch.no_grad()
    def random_sparsify(self):
        self.backward_masks = []
        for l, w in enumerate(self.W):
            n = self.N[l]
            s = int(self.S[l] * n)
            flat_mask = torch.ones(n)
            flat_mask[torch.randperm(n)[:s]] = 0
            mask = flat_mask.reshape(w.shape).bool()
            w.mul_(mask)
            self.backward_masks.append(mask)

    def next_step_is_rigl(self):
        s = self.step + 1
        return s % self.delta_T == 0 and s < self.T_end

    def __call__(self):
        """Returns True when the caller should take a normal optimizer step."""
        self.step += 1
        if self.step % self.delta_T == 0 and self.step < self.T_end:
            self._rigl_step()
            self.rigl_steps += 1
            return False
        return True

    def cosine_annealing(self):
        return self.alpha / 2 * (1 + np.cos(self.step * np.pi / self.T_end))

    @torch.no_grad()
    def reset_momentum(self):
        for w, mask in zip(self.W, self.backward_masks):
            buf = self.optimizer.state[w].get("momentum_buffer")
            if buf is not None:
                buf.mul_(mask)

    @torch.no_grad()
    def apply_mask_to_weights(self):
        for w, mask in zip(self.W, self.backward_masks):
            w.mul_(mask)

    def _after_step(self):
        self.reset_momentum()
        self.apply_mask_to_weights()

    @torch.no_grad()
    def _rigl_step(self):
        drop_fraction = self.cosine_annealing()
        for l, w in enumerate(self.W):
            current_mask = self.backward_masks[l]
            score_drop = torch.abs(w).flatten()
            score_grow = torch.abs(self.hooks[l].dense_grad).flatten()
            n_total = self.N[l]
            n_ones = int(current_mask.sum().item())
            n_prune = int(n_ones * drop_fraction)
            n_keep = n_ones - n_prune

            # keep the n_keep largest-magnitude active weights
            keep_idx = torch.topk(torch.where(current_mask.flatten(), score_drop,
                                              torch.full_like(score_drop, -1.0)), k=n_keep).indices
            mask1 = torch.zeros(n_total, dtype=torch.bool)
            mask1[keep_idx] = True
            # grow n_prune connections with the largest dense gradient among the rest
            lifted = torch.where(mask1, torch.full_like(score_grow, score_grow.min() - 1), score_grow)
            grow_idx = torch.topk(lifted, k=n_prune).indices
            mask2 = torch.zeros(n_total, dtype=torch.bool)
            mask2[grow_idx] = True

            new_connections = (mask2 & ~current_mask.flatten()).reshape(w.shape)
            w.copy_(torch.where(new_connections, torch.zeros_like(w), w))  # grown weights start at 0
            current_mask.copy_((mask1 | mask2).reshape(w.shape))
        self.reset_momentum()
        self.apply_mask_to_weights()
        for w, mask in zip(self.W, self.backward_masks):
            if w.grad is not None:
                w.grad.mul_(mask)

    def density(self):
        nz = sum(int((w != 0).sum()) for w in self.W)
        return nz / sum(self.N)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(32 * 6 * 6, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(n, gen):
    templates = (torch.rand(10, 1, 16, 16, generator=torch.Generator().manual_seed(3)) > 0.6).float()
    y = torch.randint(0, 10, (n,), generator=gen)
    shift = torch.randint(-1, 2, (n, 2), generator=gen)
    x = torch.stack([torch.roll(templates[c], (int(s[0]), int(s[1])), dims=(1, 2)) for c, s in zip(y, shift)])
    return x + 0.3 * torch.randn(x.shape, generator=gen), y


def test(model, loader):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            out = model(data)
            loss += F.nll_loss(out, target, reduction="sum").item()
            correct += out.argmax(1).eq(target).sum().item()
    n = len(loader.dataset)
    print(f"Test set: Average loss: {loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dense-allocation", type=float, default=0.3)
    parser.add_argument("--delta", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=0.3)
    args = parser.parse_args()
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(0)
    xtr, ytr = synthetic_digits(1280, gen)
    xte, yte = synthetic_digits(400, gen)
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=64, shuffle=True)
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xte, yte), batch_size=200)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    T_end = int(0.75 * args.epochs * len(train_loader))
    pruner = RigLScheduler(model, optimizer, dense_allocation=args.dense_allocation, T_end=T_end,
                           delta=args.delta, alpha=args.alpha)
    print(f"sparse layers: {len(pruner.W)}, initial density {pruner.density():.3f}, T_end={T_end}")

    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            if pruner():
                optimizer.step()
            else:
                print(f"  [rigl step {pruner.rigl_steps} at iter {pruner.step}] topology updated, "
                      f"drop fraction {pruner.cosine_annealing():.3f}, density {pruner.density():.3f}")
            if batch_idx % 5 == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.4f}")
        test(model, test_loader)
    print(f"final density of sparse layers: {pruner.density():.3f}")


if __name__ == "__main__":
    main()
