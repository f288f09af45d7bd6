"""Federated learning (FedAvg + FedProx proximal term) simulated on 2 gloo ranks, 2 clients per rank.

Modelled on: shaoxiongji/federated-learning (``main_fed.py``: per round, sample
``m = max(int(frac * num_users), 1)`` clients with ``np.random.choice``, train each on a
``copy.deepcopy(net_glob)`` via ``LocalUpdate.train`` with a freshly built SGD, then
``FedAvg(w_locals)`` and ``net_glob.load_state_dict(w_glob)``), with two standard
changes: the average is weighted by client sample counts (McMahan et al. 2017) and the
local objective carries FedProx's proximal term ``mu/2 * ||w - w_global||^2``
(Li et al. 2020, litian96/FedProx).  Clients live on two processes and the weighted
average is done with ``dist.all_reduce`` instead of an in-process loop.

What is unusual about the loop (all on purpose):
  * no DDP: between aggregations the ranks hold different local weights, and during a
    round each client's model drifts away from the global one;
  * client sampling uses an RNG seeded identically on all ranks, so every rank agrees
    on who trains; a rank has 1 or 2 selected clients in a round here, so the ranks do
    different numbers of optimizer steps (55 vs 65 in total); a rank with no selected
    client would contribute zeros to the all-reduce;
  * client data are non-IID and of very different sizes (label-skewed Dirichlet split);
  * every local model gets a new SGD optimizer each round (momentum is not carried);
  * dropout RNG is seeded per rank; the global model is checked to be bit-identical on
    both ranks after every aggregation; rank 0 alone evaluates.
"""
import copy

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
NUM_USERS, NUM_CLASSES, N_FEATURES = 4, 5, 16


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, N_FEATURES, generator=torch.Generator().manual_seed(0)) * 1.5
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = centers[y] + torch.randn(n, N_FEATURES, generator=g)
    return x, y


def dirichlet_split(y, num_users, alpha, seed):
    """Label-skewed partition: each class is split across users with Dirichlet(alpha) proportions."""
    rng = np.random.RandomState(seed)
    dict_users = {u: [] for u in range(num_users)}
    for c in range(NUM_CLASSES):
        idx = np.nonzero(y.numpy() == c)[0]
        rng.shuffle(idx)
        cuts = (np.cumsum(rng.dirichlet(alpha * np.ones(num_users))) * len(idx)).astype(int)[:-1]
        for u, part in enumerate(np.split(idx, cuts)):
            dict_users[u].extend(part.tolist())
    return dict_users


class MLP(nn.Module):
    def __init__(self, dim_in=N_FEATURES, dim_hidden=64, dim_out=NUM_CLASSES):
        super().__init__()
        self.layer_input = nn.Linear(dim_in, dim_hidden)
        self.dropout = nn.Dropout(0.2)
        self.layer_hidden = nn.Linear(dim_hidden, dim_out)

    def forward(self, x):
        return self.layer_hidden(self.dropout(F.relu(self.layer_input(x))))


class LocalUpdate:
    def __init__(self, x, y, local_bs=16, local_steps=5, lr=0.05, momentum=0.5, mu=0.01):
        self.ldr_train = DataLoader(TensorDataset(x, y), batch_size=local_bs, shuffle=True, drop_last=len(x) > local_bs)
        self.local_steps, self.lr, self.momentum, self.mu = local_steps, lr, momentum, mu
        self.n = len(x)

    def train(self, net, global_params):
        net.train()
        optimizer = torch.optim.SGD(net.parameters(), lr=self.lr, momentum=self.momentum)
        losses, step = [], 0
        while step < self.local_steps:
            for images, labels in self.ldr_train:
                net.zero_grad()
                loss = F.cross_entropy(net(images), labels)
                prox = sum((w - w_t).pow(2).sum() for w, w_t in zip(net.parameters(), global_params))
                (loss + self.mu / 2 * prox).backward()
                optimizer.step()
                losses.append(loss.item())
                step += 1
                if step == self.local_steps:
                    break
        return net.state_dict(), float(np.mean(losses))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(1200, seed=1)
    test_x, test_y = make_data(400, seed=2)
    dict_users = dirichlet_split(y, NUM_USERS, alpha=0.5, seed=3)
    my_users = [u for u in range(NUM_USERS) if u % world == rank]
    locals_ = {u: LocalUpdate(x[dict_users[u]], y[dict_users[u]]) for u in my_users}
    print(f"rank {rank}: clients {my_users} sizes {[locals_[u].n for u in my_users]} "
          f"label counts {[np.bincount(y[dict_users[u]].numpy(), minlength=NUM_CLASSES).tolist() for u in my_users]}")

    torch.manual_seed(0)
    net_glob = MLP()  # same init on every rank (same seed); verified below
    torch.manual_seed(1000 + rank)  # dropout masks differ per rank on purpose
    select_rng = np.random.RandomState(42)  # identical on all ranks
    frac, rounds = 0.75, 8
    for rnd in range(rounds):
        m = max(int(frac * NUM_USERS), 1)
        idxs_users = select_rng.choice(range(NUM_USERS), m, replace=False)
        global_params = [p.detach().clone() for p in net_glob.parameters()]
        w_glob = net_glob.state_dict()
        acc = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in w_glob.items()}
        stats = torch.zeros(3)  # [sum n_k, sum n_k * loss_k, number of clients]
        for idx in idxs_users:
            if idx not in locals_:
                continue
            local = locals_[idx]
            w, loss = local.train(copy.deepcopy(net_glob), global_params)
            for k in acc:
                acc[k] += local.n * w[k].float()
            stats += torch.tensor([local.n, local.n * loss, 1.0])
        for k in acc:
            dist.all_reduce(acc[k])
        dist.all_reduce(stats)
        net_glob.load_state_dict({k: acc[k] / stats[0] for k in acc})

        flat = torch.cat([p.detach().flatten() for p in net_glob.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        assert torch.equal(flat, ref), "global model differs across ranks"
        if rank == 0:
            net_glob.eval()
            with torch.no_grad():
                logits = net_glob(test_x)
            net_glob.train()
            print(f"round {rnd}: clients {sorted(idxs_users.tolist())} avg local loss {stats[1] / stats[0]:.4f} "
                  f"test loss {F.cross_entropy(logits, test_y).item():.4f} "
                  f"test acc {(logits.argmax(1) == test_y).float().mean().item():.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
