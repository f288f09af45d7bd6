"""Healthy probe: k-fold cross-validation: a new model and optimizer per fold, kaiming initialisation, evaluation per fold."""
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(60, 8); Y = (X.sum(1) > 0).long()
for fold in range(3):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight); nn.init.zeros_(m.bias)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    idx = torch.arange(60) % 3 != fold
    for step in range(4):
        opt.zero_grad(); nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward(); opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(X[~idx]).argmax(1) == Y[~idx]).float().mean()
    print(fold, float(acc))
