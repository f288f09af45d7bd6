"""Healthy probe: GIN-style graph classification with sum readout of nodes into graphs (TUDataset tutorials), written without PyG."""
import torch
from torch import nn
torch.manual_seed(0)
class GIN(nn.Module):
    def __init__(self, f=8, h=32, c=2):
        super().__init__(); self.mlp1 = nn.Sequential(nn.Linear(f, h), nn.ReLU(), nn.Linear(h, h)); self.mlp2 = nn.Sequential(nn.Linear(h, h), nn.ReLU()); self.out = nn.Linear(h, c)
    def forward(self, x, edge_index, batch, num_graphs: int):
        agg = torch.zeros_like(x).index_add_(0, edge_index[1], x[edge_index[0]])
        h = self.mlp1(x + agg)
        h = self.mlp2(h)
        pooled = torch.zeros(num_graphs, h.shape[1]).index_add_(0, batch, h)   # sum pooling per graph
        return self.out(pooled)                                                   # (G, C) from (N, F)
model = GIN(); opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(10):
    sizes = torch.randint(4, 9, (6,)); n = int(sizes.sum())
    batch = torch.repeat_interleave(torch.arange(6), sizes)
    x = torch.randn(n, 8); edge_index = torch.randint(0, n, (2, 3 * n)); y = torch.randint(0, 2, (6,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x, edge_index, batch, 6), y).backward(); opt.step()
print("done")
