"""Snapshot-ensemble training of a small CNN with cosine warm restarts (SGDR).

Modelled on: pytorch/pytorch#78003 "CosineAnnealingLR: LR stuck at 0 after
re-initializing scheduler".  The reporter implemented warm restarts the way many
snapshot-ensemble / SGDR scripts do: at the end of every cosine cycle a *new*
``CosineAnnealingLR(optimizer, T_max, last_epoch=-1)`` is built on the same
optimizer.  Since the schedulers became chainable, a freshly built
CosineAnnealingLR starts from the optimizer's *current* lr (which is ~eta_min at
the end of a cycle) and keeps multiplying it by ratios, so every cycle after the
first one runs at lr ~ 0.  Nothing crashes, the loss is flat-but-plausible and
the "snapshots" are all the same model.  The fix discussed in the thread is to
restart from the base lr (equivalently, use CosineAnnealingWarmRestarts): reset
each group's lr to its ``initial_lr`` before re-creating the scheduler.

Unusual about the loop: cycles of 10 optimizer steps, a snapshot (deep copy of
the weights) is kept at every cycle end and the final prediction is the
average of the snapshots' softmax outputs; SGD with nesterov momentum.
Run: python p01_snapshot_ensemble_cosine_reinit.py [--healthy]
"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def make_data(n, num_classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(num_classes, 3, 16, 16, generator=torch.Generator().manual_seed(123))
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = protos[y] * 0.6 + torch.randn(n, 3, 16, 16, generator=g)
    return x, y


class SmallNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


@torch.no_grad()
def ensemble_accuracy(snapshots, model, x, y):
    probs = 0
    for sd in snapshots:
        model.load_state_dict(sd)
        model.eval()
        probs = probs + F.softmax(model(x), dim=1)
    return (probs.argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--cycle_len", type=int, default=10)
    parser.add_argument("--num_cycles", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    x_train, y_train = make_data(2560, seed=1)
    x_val, y_val = make_data(512, seed=2)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_train, y_train), batch_size=64, shuffle=True,
        generator=torch.Generator().manual_seed(0))

    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.cycle_len, last_epoch=-1)

    snapshots, lr_trace = [], []
    total_steps = args.cycle_len * args.num_cycles
    step, data_iter = 0, iter(loader)
    w_at_first_restart = None
    while step < total_steps:
        try:
            xb, yb = next(data_iter)
        except StopIteration:
            data_iter = iter(loader)
            xb, yb = next(data_iter)
        model.train()
        lr_trace.append(optimizer.param_groups[0]["lr"])
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if step % 5 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} lr {lr_trace[-1]:.5f}")

        if step % args.cycle_len == 0:
            # end of a cosine cycle: keep a snapshot and restart the schedule
            snapshots.append(copy.deepcopy(model.state_dict()))
            if step == args.cycle_len:
                w_at_first_restart = torch.cat([p.detach().flatten() for p in model.parameters()])
            if step < total_steps:
                if args.healthy:
                    for group in optimizer.param_groups:
                        group["lr"] = group["initial_lr"]
                else:
                    if step == args.cycle_len:
                        print(f"ONSET step {step}")
                scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                    optimizer, T_max=args.cycle_len, last_epoch=-1)

    w_end = torch.cat([p.detach().flatten() for p in model.parameters()])
    acc = ensemble_accuracy(snapshots, copy.deepcopy(model), x_val, y_val)
    restart_lrs = [lr_trace[i] for i in range(args.cycle_len, total_steps, args.cycle_len)]
    print("EVIDENCE lr at restarts=" + ",".join(f"{v:.2e}" for v in restart_lrs)
          + f" | weight change after first restart={(w_end - w_at_first_restart).norm().item():.4f}"
          + f" | snapshot-ensemble val acc={acc:.3f}")


if __name__ == "__main__":
    main()
