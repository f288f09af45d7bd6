"""Multi-label bird-call detection on (synthetic) mel spectrograms, trained in two sessions.

A small CNN wrapper in the style of opensoundscape's ``CNN`` class: ``network.feature`` /
``network.classifier``, an ``optimizer_params`` dict with per-part SGD settings (feature lr 5e-2,
classifier lr 1e-1, momentum, weight decay), ``train(epochs)``, ``save(path)`` and
``load_model(path)``.  Session 1 trains two epochs and saves ``epoch-1.model``; session 2 loads that
file and "continues training" for three more epochs, as users do after a preempted job.

Modelled on: kitzeslab/opensoundscape#351 "Continuing training of CNN from loaded model may not be
working": ``load()`` restored ``self.optimizer_params = model_dict["optimizer_params"]``, and that
dict holds the *parameter tensors* of the network that was saved, so ``_init_optimizer()`` built SGD
over stale copies instead of the freshly constructed network.  The loaded model then never changes
while the loss keeps being reported.  The maintainer's patch re-points ``optimizer_params[...]["params"]``
at the current ``network`` after loading.

Unusual about the loop: two training sessions in one process, the model object is rebuilt from
disk between them, the optimizer is re-created from a saved parameter dict.  Optimizer steps are
counted across both sessions (16 + 24).  ``--healthy`` applies the re-pointing fix in ``load()``.
"""
import argparse
import os
import tempfile
import time

import torch
import torch.nn as nn

torch.set_num_threads(1)
CLASSES = ["amro", "bcch", "woth", "eato"]
N_MELS, N_FRAMES = 32, 48


def synth_clips(n, seed):
    """Each species = a chirp with its own start frequency/slope; 0-3 species per clip + noise."""
    g = torch.Generator().manual_seed(seed)
    X = 0.3 * torch.rand(n, 1, N_MELS, N_FRAMES, generator=g)
    Y = (torch.rand(n, len(CLASSES), generator=g) < 0.35).float()
    f0 = torch.tensor([6.0, 12.0, 20.0, 26.0])
    slope = torch.tensor([0.25, -0.15, 0.1, -0.3])
    t = torch.arange(N_FRAMES).float()
    mel = torch.arange(N_MELS).float()[:, None]
    for i in range(n):
        for c in range(len(CLASSES)):
            if Y[i, c] > 0:
                start = int(torch.randint(0, N_FRAMES - 20, (1,), generator=g))
                track = f0[c] + slope[c] * (t - start)
                on = ((t >= start) & (t < start + 18)).float()
                X[i, 0] += on * torch.exp(-(mel - track) ** 2 / 2.0)
    return X, Y


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.feature = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(32, n_classes)


class CNN:
    def __init__(self, classes):
        self.classes = classes
        self.network = Net(len(classes))
        self.current_epoch = 0
        self.opt_net = None
        self.optimizer_cls = torch.optim.SGD
        self.optimizer_params = {
            "feature": {"params": list(self.network.feature.parameters()),
                        "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
            "classifier": {"params": list(self.network.classifier.parameters()),
                           "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        }
        self.loss_hist = {}
        self.step_count = 0

    def _init_optimizer(self):
        return self.optimizer_cls(self.optimizer_params.values())

    def train(self, X, Y, epochs, batch_size=16, seed=0, on_step=None):
        if self.opt_net is None:
            self.opt_net = self._init_optimizer()
        criterion = nn.BCEWithLogitsLoss()
        g = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            self.network.train()
            order = torch.randperm(len(X), generator=g)
            for i in range(0, len(X), batch_size):
                idx = order[i:i + batch_size]
                if on_step is not None:
                    on_step(self.step_count)
                logits = self.network.classifier(self.network.feature(X[idx]))
                loss = criterion(logits, Y[idx])
                self.opt_net.zero_grad()
                loss.backward()
                self.opt_net.step()
                self.loss_hist[self.step_count] = loss.item()
                self.step_count += 1
            print(f"epoch {self.current_epoch} last-batch loss {loss.item():.4f}", flush=True)
            self.current_epoch += 1

    @torch.no_grad()
    def evaluate(self, X, Y, threshold=0.5):
        self.network.eval()
        pred = (torch.sigmoid(self.network.classifier(self.network.feature(X))) > threshold).float()
        tp = (pred * Y).sum()
        return float(2 * tp / (pred.sum() + Y.sum()).clamp(min=1))

    def save(self, path):
        torch.save({"classes": self.classes, "epoch": self.current_epoch, "step": self.step_count,
                    "loss_hist": self.loss_hist, "optimizer_params": self.optimizer_params,
                    "model_state_dict": self.network.state_dict(),
                    "optimizer_state_dict": self.opt_net.state_dict()}, path)

    def load(self, path, healthy=False):
        model_dict = torch.load(path, weights_only=False)
        self.current_epoch = model_dict["epoch"]
        self.step_count = model_dict["step"]
        self.loss_hist = model_dict["loss_hist"]
        self.optimizer_params = model_dict["optimizer_params"]
        if healthy:  # the patch from the issue: point the saved settings at *this* network
            self.optimizer_params["feature"]["params"] = list(self.network.feature.parameters())
            self.optimizer_params["classifier"]["params"] = list(self.network.classifier.parameters())
        self.network.load_state_dict(model_dict["model_state_dict"])
        self.opt_net = self._init_optimizer()
        self.opt_net.load_state_dict(model_dict["optimizer_state_dict"])


def load_model(path, healthy=False):
    classes = torch.load(path, weights_only=False)["classes"]
    model = CNN(classes)
    model.load(path, healthy=healthy)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    Xtr, Ytr = synth_clips(128, 1)
    Xva, Yva = synth_clips(64, 2)
    save_dir = tempfile.mkdtemp(prefix="birdcnn_")

    model = CNN(CLASSES)
    model.train(Xtr, Ytr, epochs=2, seed=10)
    print(f"session 1 val F1 {model.evaluate(Xva, Yva):.3f}")
    path = os.path.join(save_dir, "epoch-1.model")
    model.save(path)
    del model

    # --- session 2: resume from the saved object -------------------------------------------
    model = load_model(path, healthy=args.healthy)
    resume_step = model.step_count
    w0 = {k: p.detach().clone() for k, p in model.network.named_parameters()}
    live = {id(p) for p in model.network.parameters()}
    in_opt = sum(id(p) in live for grp in model.opt_net.param_groups for p in grp["params"])

    def on_step(step):
        if not args.healthy and step == resume_step:
            print(f"ONSET step {step}", flush=True)

    model.train(Xtr, Ytr, epochs=3, seed=11, on_step=on_step)
    drift = max((p.detach() - w0[k]).abs().max().item() for k, p in model.network.named_parameters())
    f1 = model.evaluate(Xva, Yva)
    print(f"session 2 val F1 {f1:.3f}")
    print(f"EVIDENCE optimizer params that belong to the live network: {in_opt}/"
          f"{len(live)}; max |weight change| during session 2 (steps {resume_step}-"
          f"{model.step_count - 1}) = {drift:.4f}; final val F1 = {f1:.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
