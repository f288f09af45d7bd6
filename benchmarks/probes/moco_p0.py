"""Healthy probe: MoCo-style contrastive learning: a momentum key encoder updated in place and run without gradients in training mode (dropout rate 0), a negatives queue."""
import copy, torch
from torch import nn
torch.manual_seed(0)
def encoder():
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.0), nn.Linear(32, 8))
q_enc = encoder(); k_enc = copy.deepcopy(q_enc)
for p in k_enc.parameters(): p.requires_grad_(False)
opt = torch.optim.SGD(q_enc.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(0)
queue = nn.functional.normalize(torch.randn(64, 8, generator=g), dim=1)
for step in range(12):
    x = torch.randn(16, 16, generator=g)
    q = nn.functional.normalize(q_enc(x + 0.1 * torch.randn_like(x)), dim=1)
    with torch.no_grad():
        for pq, pk in zip(q_enc.parameters(), k_enc.parameters()):
            pk.data.mul_(0.99).add_(pq.data, alpha=0.01)
        k = nn.functional.normalize(k_enc(x + 0.1 * torch.randn_like(x)), dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], 1) / 0.07
    loss = nn.functional.cross_entropy(logits, torch.zeros(16, dtype=torch.long))
    opt.zero_grad(); loss.backward(); opt.step()
    queue = torch.cat([k, queue])[:64]
print("done")
