"""Two-tower retrieval model (user tower / item tower) with in-batch sampled softmax.

After a joint warm-up the item embeddings are exported to the ANN index, so the item tower is
"frozen" and only the user tower keeps adapting to fresh interactions.  The freeze is done the
way the report does it: a gradient hook on every item-tower parameter that returns zeros, while
a single SGD optimizer (momentum + weight decay) keeps stepping all parameters.

Modelled on: pytorch/pytorch issue #38581 "Weight_decay in SGD doesn't respect hooks" — a hook
returning all-zero grads does not stop SGD from changing the weights: weight decay (and the
momentum buffer accumulated before the freeze) are still applied, so the "frozen" parameters
keep moving.

Unusual about the loop: the freeze is applied mid-training, right after the item index is
built, so the served index silently goes stale relative to the item tower being trained.
--healthy: the item tower is frozen with requires_grad_(False) (grads stay None, so SGD skips
those parameters entirely).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

N_USERS, N_ITEMS, DIM = 100, 200, 16


class Tower(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.emb = nn.Embedding(n, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, dim))

    def forward(self, idx):
        return F.normalize(self.mlp(self.emb(idx)), dim=-1)


def interactions(n, seed):
    g = torch.Generator().manual_seed(seed)
    u_lat = torch.randn(N_USERS, 8, generator=torch.Generator().manual_seed(123))
    i_lat = torch.randn(N_ITEMS, 8, generator=torch.Generator().manual_seed(321))
    users = torch.randint(0, N_USERS, (n,), generator=g)
    scores = u_lat[users] @ i_lat.T + 0.5 * torch.randn(n, N_ITEMS, generator=g)
    items = scores.argmax(1)
    return users, items


def freeze_item_tower(tower):
    if HEALTHY:
        tower.requires_grad_(False)
    else:
        for p in tower.parameters():
            p.register_hook(lambda grad: torch.zeros_like(grad))


@torch.no_grad()
def recall_at_10(user_tower, item_index, users, items):
    scores = user_tower(users) @ item_index.T
    top = scores.topk(10, dim=1).indices
    return (top == items[:, None]).any(1).float().mean().item()


def main():
    torch.manual_seed(0)
    user_tower, item_tower = Tower(N_USERS, DIM), Tower(N_ITEMS, DIM)
    params = list(user_tower.parameters()) + list(item_tower.parameters())
    optimizer = torch.optim.SGD(params, lr=0.2, momentum=0.9, weight_decay=1e-3)
    users, items = interactions(40 * 128, seed=1)
    val_users, val_items = interactions(1000, seed=2)
    temperature, bs, freeze_at = 0.1, 128, 12
    all_items = torch.arange(N_ITEMS)

    item_index = None
    for step in range(40):
        if step == freeze_at:
            with torch.no_grad():
                item_index = item_tower(all_items).clone()
                snapshot = [p.detach().clone() for p in item_tower.parameters()]
            freeze_item_tower(item_tower)
            if not HEALTHY:
                print(f"ONSET step {step}")
        sl = slice(step * bs, (step + 1) * bs)
        u, it = users[sl], items[sl]
        logits = user_tower(u) @ item_tower(it).T / temperature
        loss = F.cross_entropy(logits, torch.arange(len(u)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        msg = f"step {step:3d} loss {loss.item():.4f}"
        if item_index is not None:
            msg += f" recall@10(index) {recall_at_10(user_tower, item_index, val_users, val_items):.3f}"
        print(msg)

    with torch.no_grad():
        drift = sum((p - s).norm() ** 2 for p, s in zip(item_tower.parameters(), snapshot)) ** 0.5
        index_gap = (item_tower(all_items) - item_index).norm(dim=1).mean()
    print(f"EVIDENCE frozen_item_tower_param_drift={drift:.4f} index_vs_tower_gap={index_gap:.4f} "
          f"recall@10={recall_at_10(user_tower, item_index, val_users, val_items):.3f}")


if __name__ == "__main__":
    main()
