"""Source training, then Tent test-time adaptation (entropy minimisation of BN affine params), in Lightning.

Modelled on: DequanWang/tent (Wang et al., "Tent: Fully Test-Time Adaptation by Entropy
Minimization", ICLR 2021): ``tent.py`` (``configure_model``: ``model.train()``,
``requires_grad_(False)`` except BatchNorm weight/bias, ``track_running_stats = False`` and
``running_mean = running_var = None`` so normalisation always uses the test batch statistics;
``collect_params``; ``forward_and_adapt`` under ``torch.enable_grad()``: the predictions are the
outputs of the same forward whose entropy is then minimised; ``copy_model_and_optimizer`` /
``load_model_and_optimizer`` for ``reset()``) and ``cifar10c.py`` (Adam on the BN params, the
model and optimizer reset before each new corruption type).

Stage 1 trains a small CNN with BatchNorm on the labelled source domain (automatic optimisation).
Stage 2 is a second LightningModule with manual optimisation that adapts the trained network on
two unlabelled, shifted target domains one after the other; labels are used only to report the
online accuracy, never in the loss.

Unusual but correct: the objective in stage 2 is the prediction entropy (no labels); only about 1% of
the parameters (BN affine) are optimised; BN running buffers are deleted and the network stays in
train mode while "testing"; at the domain switch the weights and the Adam state are restored from
copies taken before adaptation (a deliberate jump back of the parameters and optimizer moments).
"""
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning.pytorch as pl

torch.set_num_threads(1)

N_CLASSES, SIZE = 4, 12


def make_net():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, N_CLASSES))


class SourceClassifier(pl.LightningModule):
    def __init__(self, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = make_net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("source_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr)


def softmax_entropy(x):
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


def configure_model(model):
    model.train()
    model.requires_grad_(False)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.requires_grad_(True)
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
    return model


def collect_params(model):
    params, names = [], []
    for nm, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            for np_, p in m.named_parameters():
                if np_ in ["weight", "bias"]:
                    params.append(p)
                    names.append(f"{nm}.{np_}")
    return params, names


class TentAdapter(pl.LightningModule):
    """Episodic-per-domain Tent: reset model + optimizer whenever the target domain changes."""

    def __init__(self, net, lr=1e-3, steps=1):
        super().__init__()
        self.automatic_optimization = False
        self.net = configure_model(net)
        self.lr, self.steps = lr, steps
        self.current_domain = None
        self.correct, self.seen = {}, {}

    def configure_optimizers(self):
        params, _ = collect_params(self.net)
        return torch.optim.Adam(params, lr=self.lr, betas=(0.9, 0.999), weight_decay=0.0)

    def on_train_start(self):
        opt = self.optimizers().optimizer
        self.model_state = copy.deepcopy(self.net.state_dict())
        self.optimizer_state = copy.deepcopy(opt.state_dict())

    def reset(self):
        self.net.load_state_dict(self.model_state, strict=True)
        self.optimizers().optimizer.load_state_dict(self.optimizer_state)

    def training_step(self, batch, batch_idx):
        x, y, domain = batch
        domain = int(domain[0])
        if domain != self.current_domain:
            if self.current_domain is not None:
                self.reset()            # new corruption type: start again from the source model
            self.current_domain = domain
        opt = self.optimizers()
        for _ in range(self.steps):
            outputs = self.net(x)
            loss = softmax_entropy(outputs).mean(0)
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()
        self.correct[domain] = self.correct.get(domain, 0) + (outputs.argmax(1) == y).sum().item()
        self.seen[domain] = self.seen.get(domain, 0) + len(y)
        self.log("entropy", loss)


def make_images(n, seed, scale=1.0, offset=0.0, noise=0.3):
    g = np.random.default_rng(seed)
    y = g.integers(0, N_CLASSES, n)
    xs = np.zeros((n, 1, SIZE, SIZE), dtype=np.float32)
    r = np.arange(SIZE)
    for i, c in enumerate(y):
        p = int(g.integers(0, SIZE - 3))
        if c == 0:
            xs[i, 0, p:p + 3, :] = 1.0                      # horizontal bar
        elif c == 1:
            xs[i, 0, :, p:p + 3] = 1.0                      # vertical bar
        elif c == 2:
            xs[i, 0][np.abs(r[:, None] - r[None, :] - (p - 4)) < 2] = 1.0   # diagonal
        else:
            xs[i, 0, p:p + 4, p:p + 4] = 1.0                # square
    xs = scale * xs + offset + noise * g.standard_normal(xs.shape).astype(np.float32)
    return torch.from_numpy(xs.astype(np.float32)), torch.from_numpy(y)


@torch.no_grad()
def source_accuracy(net, x, y):
    net.eval()
    acc = (net(x).argmax(1) == y).float().mean().item()
    net.train()
    return acc


def main():
    pl.seed_everything(3)
    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False)

    xs, ys = make_images(32 * 30, 0)
    source = SourceClassifier()
    pl.Trainer(max_epochs=1, **kw).fit(
        source, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=32, shuffle=True))

    # two shifted target domains (contrast / brightness + noise), 15 batches of 64 each
    targets = [make_images(64 * 15, 10, scale=0.5, offset=0.8, noise=0.45),
               make_images(64 * 15, 11, scale=1.6, offset=-0.7, noise=0.5)]
    for d, (x, y) in enumerate(targets):
        print(f"domain {d}: source model (BN running stats) accuracy {source_accuracy(source.net, x, y):.3f}")

    x_all = torch.cat([t[0] for t in targets])
    y_all = torch.cat([t[1] for t in targets])
    d_all = torch.cat([torch.full((len(t[1]),), d) for d, t in enumerate(targets)])
    target_dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all, d_all),
                                            batch_size=64, shuffle=False)

    tent = TentAdapter(copy.deepcopy(source.net))
    _, names = collect_params(tent.net)
    n_train = sum(p.numel() for p in tent.net.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in tent.net.parameters())
    print(f"Tent adapts {len(names)} tensors, {n_train}/{n_all} parameters")
    pl.Trainer(max_epochs=1, **kw).fit(tent, target_dl)
    for d in sorted(tent.seen):
        print(f"domain {d}: Tent online accuracy {tent.correct[d] / tent.seen[d]:.3f}")


if __name__ == "__main__":
    main()
