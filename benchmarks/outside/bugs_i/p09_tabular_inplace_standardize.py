"""Credit-default MLP on in-memory tabular data with a per-sample standardization transform.

Modelled on: pytorch/vision#680 "ToTensor aliases input data and operations like Normalize work
in-place" -- with the dataset held in RAM, ``__getitem__`` hands out a view of the stored tensor
and the in-place ``Normalize`` rewrites the dataset itself, so "as training progresses, the
dataset becomes more and more 'normalized'" (see the linked Stack Overflow question 53652015 on an
unexpected rise of the validation error).  torchvision fixed it by making ``Normalize``
out-of-place by default (``inplace=False``).

What is unusual about the loop: nothing looks wrong during the first epoch -- every row is
standardized exactly once.  From the second pass over the data on, each row is standardized
again (and the validation rows too), so the network silently receives inputs that are squeezed
towards a constant.  ``--healthy`` standardizes out of place (the fix).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)

FEATURES = ["income", "age", "loan_amount", "loan_term", "credit_lines", "utilization",
            "late_payments", "years_employed", "debt_to_income", "savings", "inquiries", "home_value"]


def make_credit_table(n, gen):
    # raw units: $, years, $, months, count, % of limit, count (10y), years, % of income, $, count, $
    scale = torch.tensor([5e4, 40, 2e4, 36, 9, 40, 5, 10, 30, 1e4, 6, 2e5])
    spread = torch.tensor([2e4, 12, 1e4, 12, 3, 20, 3, 5, 12, 6e3, 3, 1e5])
    z = torch.randn(n, len(FEATURES), generator=gen)
    x = (scale + spread * z).clamp(min=0)
    logit = (-1.2 * z[:, 0] + 0.9 * z[:, 5] + 1.3 * z[:, 6] + 0.8 * z[:, 8] - 0.6 * z[:, 9]
             + 0.7 * z[:, 5] * z[:, 6] - 0.5)
    y = (torch.rand(n, generator=gen) < torch.sigmoid(logit)).float()
    return x, y


class Standardize:
    def __init__(self, mean, std, inplace):
        self.mean, self.std, self.inplace = mean, std, inplace

    def __call__(self, x):
        if self.inplace:
            return x.sub_(self.mean).div_(self.std)
        return (x - self.mean) / self.std


class CreditDataset(Dataset):
    def __init__(self, features, labels, transform=None):
        self.features, self.labels, self.transform = features, labels, transform

    def __len__(self):
        return self.features.shape[0]

    def __getitem__(self, idx):
        x = self.features[idx]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[idx]


class MLP(nn.Module):
    def __init__(self, d_in, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x_train, y_train = make_credit_table(512, gen)
    x_val, y_val = make_credit_table(256, gen)
    mean, std = x_train.mean(0), x_train.std(0)
    raw_income0 = x_train[0, 0].item()
    tf = Standardize(mean, std, inplace=not args.healthy)
    train_ds = CreditDataset(x_train, y_train, tf)
    val_ds = CreditDataset(x_val, y_val, tf)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=0,
                              generator=torch.Generator().manual_seed(1))
    val_loader = DataLoader(val_ds, batch_size=128, shuffle=False)

    model = MLP(len(FEATURES))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-5)
    step = 0
    for epoch in range(args.epochs):
        if epoch == 1 and not args.healthy:
            print(f"ONSET step {step}")
        model.train()
        seen = []
        for xb, yb in train_loader:
            loss = F.binary_cross_entropy_with_logits(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(xb)
            step += 1
        model.eval()
        correct, total, vloss = 0, 0, 0.0
        with torch.no_grad():
            for xb, yb in val_loader:
                out = model(xb)
                vloss += F.binary_cross_entropy_with_logits(out, yb, reduction="sum").item()
                correct += ((out > 0).float() == yb).sum().item()
                total += yb.numel()
        print(f"epoch {epoch} step {step} train_loss {loss.item():.4f} val_loss {vloss / total:.4f} "
              f"val_acc {correct / total:.3f}")

    inputs = torch.cat(seen)
    print(f"EVIDENCE last-epoch model inputs: mean per-feature std {inputs.std(0).mean().item():.6f} "
          f"(expected ~1); stored income row 0 = {train_ds.features[0, 0].item():.4f} "
          f"(raw value {raw_income0:.1f})")


if __name__ == "__main__":
    main()
