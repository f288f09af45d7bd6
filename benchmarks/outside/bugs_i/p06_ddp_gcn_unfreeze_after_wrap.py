"""Node classification with a GCN encoder: linear-probe warm-up, then backbone unfreezing, under DDP.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_ddp_gcn_unfreeze_after_wrap.py

Modelled on: Lightning-AI/pytorch-lightning#20340 "DDP doesn't work with
pl.callbacks.BackboneFinetuning" -- after the backbone is unfrozen (``requires_grad=True``) the
model weights drift apart across processes.  DistributedDataParallel registers its gradient
all-reduce hooks only for parameters that require grad *when DDP is constructed*; a backbone that
was frozen at wrap time and unfrozen later gets purely local gradients on every rank.  The fix
adopted downstream (paninski-lab/lightning-pose PR #205, as suggested in the issue) never toggles
``requires_grad``: the backbone stays trainable and is "frozen" by a zero learning rate in its
own param group, which is raised at the unfreeze step.

What is unusual about the loop: a full-graph GCN where every rank owns a different shard of the
labelled nodes; the first ``--unfreeze-at`` steps train only the classifier head.  ``--healthy``
uses the learning-rate freezing of the fix.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)


def make_sbm_graph(n_nodes=480, n_classes=4, p_in=0.06, p_out=0.006, feat_dim=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_nodes) % n_classes
    same = labels[:, None] == labels[None, :]
    prob = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    adj = (torch.rand(n_nodes, n_nodes, generator=g) < prob).float()
    adj = torch.triu(adj, 1)
    adj = adj + adj.T + torch.eye(n_nodes)
    deg_inv_sqrt = adj.sum(1).pow(-0.5)
    a_hat = deg_inv_sqrt[:, None] * adj * deg_inv_sqrt[None, :]
    centers = torch.randn(n_classes, feat_dim, generator=g)
    x = 0.6 * centers[labels] + torch.randn(n_nodes, feat_dim, generator=g)
    return a_hat, x, labels


class GCNLayer(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(cin, cout)

    def forward(self, a_hat, h):
        return a_hat @ self.lin(h)


class GCN(nn.Module):
    def __init__(self, in_dim, hidden, n_classes):
        super().__init__()
        self.backbone = nn.ModuleList([GCNLayer(in_dim, hidden), GCNLayer(hidden, hidden)])
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, a_hat, x):
        h = x
        for layer in self.backbone:
            h = F.relu(layer(a_hat, h))
            h = F.dropout(h, 0.1, self.training)
        return self.head(h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--unfreeze-at", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--backbone-lr", type=float, default=0.02)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    a_hat, x, labels = make_sbm_graph()
    n = labels.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    train_idx, test_idx = perm[: n // 2], perm[n // 2:]
    shard = train_idx[rank::world]  # each rank owns its own labelled nodes

    torch.manual_seed(0)  # "pretrained" backbone + fresh head, identical on all ranks
    model = GCN(x.shape[1], 32, 4)
    backbone_params = list(model.backbone.parameters())
    if args.healthy:
        groups = [{"params": backbone_params, "lr": 0.0},
                  {"params": model.head.parameters(), "lr": args.lr}]
    else:
        for prm in backbone_params:
            prm.requires_grad_(False)
        groups = [{"params": backbone_params, "lr": args.backbone_lr},
                  {"params": model.head.parameters(), "lr": args.lr}]
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=0.9, weight_decay=5e-4)
    torch.manual_seed(100 + rank)  # per-rank dropout masks

    for step in range(args.steps):
        if step == args.unfreeze_at:
            if args.healthy:
                optimizer.param_groups[0]["lr"] = args.backbone_lr
            else:
                for prm in backbone_params:
                    prm.requires_grad_(True)
                if rank == 0:
                    print(f"ONSET step {step}")
        ddp_model.train()
        logits = ddp_model(a_hat, x)
        loss = F.cross_entropy(logits[shard], labels[shard])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 9 and rank == 0:
            ddp_model.eval()
            with torch.no_grad():
                acc = (ddp_model(a_hat, x)[test_idx].argmax(1) == labels[test_idx]).float().mean()
            print(f"step {step:3d} loss {loss.item():.4f} test_acc {acc.item():.3f}")

    flat = torch.cat([prm.detach().flatten() for prm in backbone_params])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    head = torch.cat([prm.detach().flatten() for prm in model.head.parameters()])
    heads = [torch.zeros_like(head) for _ in range(world)]
    dist.all_gather(heads, head)
    if rank == 0:
        print(f"EVIDENCE backbone max|rank0-rank1| {(gathered[0] - gathered[1]).abs().max().item():.6f}; "
              f"head max|rank0-rank1| {(heads[0] - heads[1]).abs().max().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
