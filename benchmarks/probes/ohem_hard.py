"""Healthy probe: online hard-example mining (Shrivastava et al., 2016) in the two-pass form of mmdetection's OHEMSampler.hard_mining (which scores the RoI head under torch.no_grad() without switching it to eval mode), applied to classification: the per-sample losses of the whole batch are computed under torch.no_grad() with the model left in train mode (its dropout stays active), the hardest half is selected with topk, and a normal training forward/backward runs on those samples only.

The scoring pass is a selection heuristic, not an evaluation: it needs no graph and the
stochasticity of dropout only perturbs which samples rank as hard. A periodic validation
switches to eval mode properly.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, d_in=16, hidden=48, classes=5, p=0.25):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Dropout(p))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def make_batch(gen, n):
    x = torch.randn(n, 16, generator=gen)
    y = (x[:, :5] + 0.3 * x[:, 5:10]).argmax(1)
    flip = torch.rand(n, generator=gen) < 0.1          # label noise: some samples stay hard
    y[flip] = torch.randint(0, 5, (int(flip.sum()),), generator=gen)
    return x, y


def select_hard(model, x, y, keep_ratio):
    """OHEM: rank samples by their current loss; no graph is built for the ranking pass."""
    with torch.no_grad():
        per_sample = F.cross_entropy(model(x), y, reduction="none")
    k = max(1, int(keep_ratio * x.size(0)))
    hard = per_sample.topk(k).indices
    return hard, per_sample


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--keep-ratio", type=float, default=0.5)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    val_x, val_y = make_batch(gen, 128)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    for step in range(args.steps):
        x, y = make_batch(gen, args.batch_size)
        hard, scores = select_hard(model, x, y, args.keep_ratio)
        logits = model(x[hard])
        loss = F.cross_entropy(logits, y[hard])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step + 1} hard loss {loss.item():.4f} mean batch loss {scores.mean().item():.4f}")

        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                val_logits = model(val_x)
                val_loss = F.cross_entropy(val_logits, val_y)
                acc = (val_logits.argmax(1) == val_y).float().mean()
            print(f"  val loss {val_loss.item():.4f} acc {acc.item():.3f}")
            model.train()


if __name__ == "__main__":
    main()
