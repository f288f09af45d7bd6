"""Healthy probe: a training loop with the common non-finite-loss guard (if not torch.isfinite(loss): optimizer.zero_grad(); continue, with a patience counter like SpeechBrain's nonfinite_patience) meeting a deliberately corrupted batch that holds a NaN, torch.nn.utils.clip_grad_value_, and Hugging Face's get_linear_schedule_with_warmup written as a LambdaLR stepped per optimizer step (its learning rate is exactly 0 on the first step, as in transformers).

The skipped batch runs a forward but no backward and no optimizer or scheduler step; the
warm-up therefore counts optimizer steps, not batches.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step)
                   / float(max(1, num_training_steps - num_warmup_steps)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def make_batches(gen, count, n, bad_index):
    batches = []
    for i in range(count):
        x = torch.randn(n, 10, generator=gen)
        y = (x[:, 0] * x[:, 1] > 0).long() + (x[:, 2] > 0.5).long()
        if i == bad_index:
            x[3, 4] = float("nan")       # a corrupted sample, as a broken feature file would give
        batches.append((x, y))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=11, help="batches drawn (one of them is corrupted)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--bad-batch", type=int, default=4)
    parser.add_argument("--nonfinite-patience", type=int, default=3)
    parser.add_argument("--clip-value", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    batches = make_batches(gen, args.steps, 32, args.bad_batch)
    val_x, val_y = make_batches(gen, 1, 128, -1)[0]

    model = nn.Sequential(nn.Linear(10, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.GELU(),
                          nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup_steps, num_training_steps=args.steps)
    nonfinite_count = 0
    model.train()
    for step, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x), y)
        if not torch.isfinite(loss):
            nonfinite_count += 1
            print(f"batch {step}: non-finite loss {loss.item()}, skipping ({nonfinite_count}/{args.nonfinite_patience})")
            if nonfinite_count > args.nonfinite_patience:
                raise ValueError("Loss is not finite and patience is exhausted.")
            optimizer.zero_grad()
            continue
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), args.clip_value)
        optimizer.step()
        scheduler.step()
        print(f"batch {step}: loss {loss.item():.4f} next lr {scheduler.get_last_lr()[0]:.2e}")

    model.eval()
    with torch.no_grad():
        acc = (model(val_x).argmax(1) == val_y).float().mean()
    print(f"val acc {acc.item():.3f} skipped {nonfinite_count}")


if __name__ == "__main__":
    main()
