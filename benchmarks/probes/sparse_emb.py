"""Healthy probe: sparse embeddings trained with SparseAdam beside a dense Adam head."""
import torch
from torch import nn
torch.manual_seed(0)
emb = nn.Embedding(1000, 16, sparse=True)
head = nn.Linear(16, 2)
opt_s = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
opt_d = torch.optim.Adam(head.parameters(), lr=1e-2)
for step in range(10):
    idx = torch.randint(0, 1000, (32, 5)); y = torch.randint(0, 2, (32,))
    opt_s.zero_grad(); opt_d.zero_grad()
    loss = nn.functional.cross_entropy(head(emb(idx).mean(1)), y)
    loss.backward(); opt_s.step(); opt_d.step()
print("done")
