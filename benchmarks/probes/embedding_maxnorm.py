"""Healthy probe: a matrix-factorisation recommender with max_norm embeddings (renormalised in place by the forward) and Adagrad."""
import torch
from torch import nn
torch.manual_seed(0)
class Rec(nn.Module):
    def __init__(self):
        super().__init__(); self.users = nn.Embedding(100, 16, max_norm=1.0); self.items = nn.Embedding(200, 16, max_norm=1.0, padding_idx=0)
    def forward(self, u, i): return (self.users(u) * self.items(i)).sum(-1)
model = Rec(); opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
for step in range(10):
    u = torch.randint(0, 100, (64,)); i = torch.randint(0, 200, (64,)); r = torch.rand(64)
    opt.zero_grad(); nn.functional.mse_loss(model(u, i), r).backward(); opt.step()
print("done")
