"""Hinton's Forward-Forward algorithm: greedy layer-by-layer training, no end-to-end backprop.

Modelled on: mpezeshki/pytorch_forward_forward ``main.py`` (Hinton, "The Forward-Forward
Algorithm: Some Preliminary Investigations", 2022): ``overlay_y_on_x`` writes a one-hot
label into the first 10 inputs, positive data carry the true label and negative data a
shuffled one, every ``Layer(nn.Linear)`` owns its own Adam optimizer (lr 0.03) and is
trained for ``num_epochs`` full-batch iterations on a softplus "goodness" loss around a
threshold of 2.0, and the detached outputs of a trained layer become the inputs of the
next one.  Prediction picks the label with the largest summed goodness.  MNIST is
replaced by a synthetic 10-class data set of 64-dimensional vectors.

What is unusual about the loop:
  * There is no global loss and no backprop between layers: layer 2's parameters do not
    change at all while layer 1 trains, and layer 1 is frozen (never touched again)
    while layer 2 trains; each layer has a separate optimizer stepping on its own.
  * Each layer's input is length-normalised, and the "loss" of layer 2 starts high again
    when its training begins (a fresh layer on new inputs).  In a run this short the
    second layer is still weak, so adding its goodness makes test error go *up* (about
    0.08 -> 0.20); that is a property of FF with few iterations, not a fault.
  * A finished layer is checkpointed (weights + optimizer state) to a temp directory and
    reloaded into a fresh module before evaluation, to check that the round trip is exact.
  * (The reference calls its method ``Layer.train``, shadowing ``nn.Module.train``; it is
    named ``train_layer`` here so that ``.eval()`` / ``.train()`` keep their meaning.)
"""
import os
import tempfile

import torch
import torch.nn as nn
from torch.optim import Adam

torch.set_num_threads(1)
torch.manual_seed(1234)


def make_data(n, protos, noise=0.6, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = protos[y] + noise * torch.randn(n, protos.shape[1], generator=g)
    x = (x - x.mean()) / x.std()
    return x, y


def overlay_y_on_x(x, y):
    """Replace the first 10 features of x with a one-hot encoding of label y."""
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Layer(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, num_epochs=30, lr=0.03):
        super().__init__(in_features, out_features, bias)
        self.relu = nn.ReLU()
        self.opt = Adam(self.parameters(), lr=lr)
        self.threshold = 2.0
        self.num_epochs = num_epochs

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(self, x_pos, x_neg, name):
        for i in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            # push positive goodness above the threshold and negative goodness below it
            loss = torch.log(1 + torch.exp(torch.cat([
                -g_pos + self.threshold,
                g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            # a local derivative of this layer's own objective, not backpropagation
            loss.backward()
            self.opt.step()
            if i % 10 == 0 or i == self.num_epochs - 1:
                print(f"{name} iter {i:2d} loss {loss.item():.4f} "
                      f"g_pos {g_pos.mean().item():.3f} g_neg {g_neg.mean().item():.3f}")
        with torch.no_grad():
            return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims, num_epochs):
        super().__init__()
        self.layers = nn.ModuleList(
            [Layer(dims[d], dims[d + 1], num_epochs=num_epochs) for d in range(len(dims) - 1)])

    @torch.no_grad()
    def predict(self, x, n_layers=None):
        layers = self.layers[:n_layers] if n_layers is not None else self.layers
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train_greedy(self, x_pos, x_neg, ckpt_dir, x_te, y_te):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print(f"training layer {i} ...")
            h_pos, h_neg = layer.train_layer(h_pos, h_neg, name=f"layer{i}")
            path = os.path.join(ckpt_dir, f"layer{i}.pt")
            torch.save({"model": layer.state_dict(), "opt": layer.opt.state_dict()}, path)
            err = 1.0 - self.predict(x_te, n_layers=i + 1).eq(y_te).float().mean().item()
            print(f"after layer {i}: test error {err:.3f} (checkpoint {os.path.basename(path)})")


def main():
    protos = torch.randn(10, 64, generator=torch.Generator().manual_seed(7))
    x, y = make_data(2048, protos, seed=1)
    x_te, y_te = make_data(1024, protos, seed=2)

    net = Net([64, 128, 128], num_epochs=30)
    x_pos = overlay_y_on_x(x, y)
    rnd = torch.randperm(x.size(0))
    x_neg = overlay_y_on_x(x, y[rnd])

    with tempfile.TemporaryDirectory() as ckpt_dir:
        net.train_greedy(x_pos, x_neg, ckpt_dir, x_te, y_te)

        restored = Net([64, 128, 128], num_epochs=30)
        for i, layer in enumerate(restored.layers):
            state = torch.load(os.path.join(ckpt_dir, f"layer{i}.pt"))
            layer.load_state_dict(state["model"])
            layer.opt.load_state_dict(state["opt"])
        same = torch.equal(restored.predict(x_te), net.predict(x_te))

    print("train error:", round(1.0 - net.predict(x).eq(y).float().mean().item(), 4))
    print("test error:", round(1.0 - net.predict(x_te).eq(y_te).float().mean().item(), 4))
    print("restored network gives identical predictions:", same)


if __name__ == "__main__":
    main()
