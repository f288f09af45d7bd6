"""Healthy probe: LoRA written by hand in the way of Sebastian Raschka's "Code LoRA from Scratch" (Lightning AI): an MLP is trained on a base task, its nn.Linear layers are then wrapped in LinearWithLoRA modules whose LoRALayer holds A (randn / sqrt(rank)) and B (zeros) as registered nn.Parameters with alpha scaling, every base parameter is frozen with requires_grad = False, the adapters (and the head) are fine-tuned on a shifted task, and finally the adapter is merged into the base weight in place (weight.data += alpha * (A @ B).T, as PEFT's merge_and_unload does) and the merged plain model is evaluated again.

The merge is exact: the merged model's logits equal the adapted model's, checked before
the program exits.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


class LoRALayer(nn.Module):
    def __init__(self, in_dim, out_dim, rank, alpha):
        super().__init__()
        self.A = nn.Parameter(torch.randn(in_dim, rank) / rank ** 0.5)
        self.B = nn.Parameter(torch.zeros(rank, out_dim))
        self.alpha = alpha

    def forward(self, x):
        return self.alpha * (x @ self.A @ self.B)


class LinearWithLoRA(nn.Module):
    def __init__(self, linear, rank, alpha):
        super().__init__()
        self.linear = linear
        self.lora = LoRALayer(linear.in_features, linear.out_features, rank, alpha)

    def forward(self, x):
        return self.linear(x) + self.lora(x)

    def merged(self):
        """Fold the adapter into the frozen base weight; returns the plain Linear."""
        with torch.no_grad():
            self.linear.weight.data += self.lora.alpha * (self.lora.A @ self.lora.B).T
        return self.linear


class MLP(nn.Module):
    def __init__(self, d_in=20, hidden=64, classes=4):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, classes))

    def forward(self, x):
        return self.layers(x)


def task(gen, n, shift=0.0):
    x = torch.randn(n, 20, generator=gen)
    y = (x[:, :4] + shift * x[:, 4:8].flip(1)).argmax(1)
    return x, y


def train(model, params, gen, steps, shift, lr):
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    for step in range(steps):
        x, y = task(gen, 64, shift)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"  step {step + 1} loss {loss.item():.4f}")


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    logits = model(x)
    return logits, (logits.argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8, help="LoRA fine-tuning steps")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    model = MLP()
    print("base training")
    train(model, model.parameters(), gen, args.base_steps, shift=0.0, lr=5e-3)

    for param in model.parameters():
        param.requires_grad = False
    for i in (0, 2):
        model.layers[i] = LinearWithLoRA(model.layers[i], args.rank, args.alpha)
    model.layers[4].weight.requires_grad = True      # the task head is trained in full
    model.layers[4].bias.requires_grad = True
    trainable = [p for p in model.parameters() if p.requires_grad]
    print(f"trainable parameters: {sum(p.numel() for p in trainable)} / {sum(p.numel() for p in model.parameters())}")

    print("LoRA fine-tuning")
    train(model, trainable, gen, args.steps, shift=1.5, lr=1e-3)

    x_test, y_test = task(gen, 256, shift=1.5)
    adapted_logits, acc = evaluate(model, x_test, y_test)
    print(f"adapted acc {acc:.3f}")
    for i in (0, 2):
        model.layers[i] = model.layers[i].merged()
    merged_logits, merged_acc = evaluate(model, x_test, y_test)
    print(f"merged acc {merged_acc:.3f}")
    assert torch.allclose(adapted_logits, merged_logits, atol=1e-4), "merge changed the function"


if __name__ == "__main__":
    main()
