"""Two-tower retrieval model (user tower / item tower, in-batch softmax) trained with
accelerate. It uses a batch-size ramp: epoch 0 runs without gradient accumulation, and
from epoch 1 on ``accelerator.gradient_accumulation_steps`` is raised to 3 (effective
batch x3).

Modelled on: huggingface/accelerate#3533 "double divide gradient_accumulation_steps"
and huggingface/transformers#40052 "Previous PRs introduced a bug on Accumulated
Gradients Losses". ``Accelerator.backward`` already does ``loss = loss /
self.gradient_accumulation_steps``, so code that also divides the loss itself (the
habit from pre-accelerate scripts: ``loss = loss / args.gradient_accumulation_steps``)
scales the gradient by 1/N**2 instead of 1/N. Nothing fails. With SGD the effective
learning rate silently drops by N as soon as accumulation is on, and while N == 1 the
extra division changes nothing.

What is unusual about the loop: the accumulation factor changes between epochs, the
optimizer is an accelerate-wrapped SGD that skips ``step()`` on non-sync micro-batches,
and clipping only happens when ``accelerator.sync_gradients``. After training, one
accumulation window is replayed and its gradient is compared with the gradient of the
mean micro-batch loss. ``--healthy`` removes the manual division.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
N_USERS, N_ITEMS, N_TOPICS = 200, 300, 40


def make_interactions(seed):
    g = torch.Generator().manual_seed(seed)
    user_topic = torch.randint(N_TOPICS, (N_USERS,), generator=g)
    item_topic = torch.randint(N_TOPICS, (N_ITEMS,), generator=g)
    users, items = [], []
    for u in range(N_USERS):
        pool = (item_topic == user_topic[u]).nonzero().flatten()
        if len(pool) == 0:
            pool = torch.arange(N_ITEMS)
        k = 5
        picks = pool[torch.randint(len(pool), (k,), generator=g)]
        users += [u] * k
        items += picks.tolist()
    users, items = torch.tensor(users), torch.tensor(items)
    perm = torch.randperm(len(users), generator=g)
    users, items = users[perm], items[perm]
    return TensorDataset(users[:768], items[:768]), (users[768:], items[768:])


class Tower(nn.Module):
    def __init__(self, n, d=32):
        super().__init__()
        self.emb = nn.Embedding(n, d)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, d))

    def forward(self, ids):
        return self.mlp(self.emb(ids))


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_tower, self.item_tower = Tower(N_USERS), Tower(N_ITEMS)

    def forward(self, users, items):
        logits = self.user_tower(users) @ self.item_tower(items).T  # in-batch negatives
        return F.cross_entropy(logits, torch.arange(len(users)))


@torch.no_grad()
def recall_at_k(model, held_out, k=10):
    users, items = held_out
    scores = model.user_tower(users) @ model.item_tower(torch.arange(N_ITEMS)).T
    topk = scores.topk(k, dim=1).indices
    return (topk == items.unsqueeze(1)).any(1).float().mean().item()


def main():
    set_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=1)
    train_ds, held_out = make_interactions(1)
    loader = DataLoader(train_ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(2))
    model = TwoTower()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def backward_micro(loss):
        if not HEALTHY:
            loss = loss / accelerator.gradient_accumulation_steps
        accelerator.backward(loss)

    ramp = {0: 1, 1: 3}
    global_step, onset_reported = 0, False
    for epoch in range(5):
        if epoch in ramp:
            accelerator.gradient_accumulation_steps = ramp[epoch]
        model.train()
        for users, items in loader:
            if not HEALTHY and accelerator.gradient_accumulation_steps > 1 and not onset_reported:
                print(f"ONSET step {global_step}")  # first optimizer step built from accumulated micro-batches
                onset_reported = True
            with accelerator.accumulate(model):
                loss = model(users, items)
                backward_micro(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                global_step += 1
        accelerator.print(f"epoch {epoch} accum {accelerator.gradient_accumulation_steps} step {global_step} "
                          f"loss {loss.item():.4f} recall@10 {recall_at_k(accelerator.unwrap_model(model), held_out):.3f}")

    # Replay one accumulation window and compare with the gradient of the mean micro-batch loss.
    window = [next(iter(loader)) for _ in range(accelerator.gradient_accumulation_steps)]
    optimizer.zero_grad()
    for users, items in window:
        with accelerator.accumulate(model):
            backward_micro(model(users, items))
    accumulated = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref_loss = sum(model(u, i) for u, i in window) / len(window)
    reference = torch.cat([g.flatten() for g in torch.autograd.grad(ref_loss, list(model.parameters()))])
    ratio = (accumulated.norm() / reference.norm()).item()
    print(f"EVIDENCE accumulated_grad_over_mean_loss_grad={ratio:.3f} optimizer_steps={global_step} "
          f"recall@10={recall_at_k(accelerator.unwrap_model(model), held_out):.3f}")


if __name__ == "__main__":
    main()
