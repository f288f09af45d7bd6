"""Healthy probe: the "Introduction to torch.compile" tutorial's training pattern applied to multi-horizon time-series forecasting: the module compiled in place with nn.Module.compile(backend="aot_eager"), a train step in eager around it with mse_loss, and validation under torch.inference_mode reporting MAE (l1_loss) from the same compiled module.

Loss-input edges: forecasts and targets are (B, horizon) on both sides, built by slicing the
same windows; nothing in the compiled region is a loss.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

LOOKBACK, HORIZON = 24, 6


class Forecaster(nn.Module):
    def __init__(self, hidden=48):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(LOOKBACK, hidden), nn.SiLU(), nn.LayerNorm(hidden), nn.Dropout(0.1),
                                 nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, HORIZON))

    def forward(self, history):
        level = history[:, -1:]                       # predict the change from the last observation
        return level + self.net(history - level)


def windows(series, starts):
    idx = starts[:, None] + torch.arange(LOOKBACK + HORIZON)
    w = series[idx]
    return w[:, :LOOKBACK], w[:, LOOKBACK:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--backend", default="aot_eager", help="eager or aot_eager run on CPU without a compiler")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t = torch.arange(600, dtype=torch.float32)
    series = torch.sin(t / 8) + 0.5 * torch.sin(t / 29) + 0.1 * torch.randn(600, generator=gen)
    split = 480

    model = Forecaster()
    model.compile(backend=args.backend)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        model.train()
        starts = torch.randint(0, split - LOOKBACK - HORIZON, (args.batch_size,), generator=gen)
        history, future = windows(series, starts)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(history), future)
        loss.backward()
        optimizer.step()
        if step % 4 == 3:
            model.eval()
            with torch.inference_mode():
                history, future = windows(series, torch.arange(split, 600 - LOOKBACK - HORIZON, 4))
                forecast = model(history)
                mae = F.l1_loss(forecast, future)
                naive = F.l1_loss(history[:, -1:].expand_as(future), future)
            print(f"step {step + 1}: train mse {loss.item():.4f} val mae {mae.item():.4f} naive {naive.item():.4f}")


if __name__ == "__main__":
    main()
