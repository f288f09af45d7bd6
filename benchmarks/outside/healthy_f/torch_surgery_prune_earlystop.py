"""Pretrain with early stopping (best weights restored), swap the head for a new task,
then fine-tune with iterative magnitude pruning.

Modelled on the PyTorch tutorial "Pruning Tutorial" (torch.nn.utils.prune:
global_unstructured with L1Unstructured, prune.remove to make it permanent) used as in the
"iterative magnitude pruning" fine-tuning recipe, preceded by the early-stopping helper of
Bjarte Sunde's pytorch-early-stopping (Bjarten/early-stopping-pytorch: keep the best
state_dict, stop after `patience` epochs without improvement, load the best weights back).

Unusual loop: phase 1 may stop before its epoch budget and rewinds the model to an earlier
epoch's weights; between phases the classifier head is replaced by a fresh module with a
different number of classes and the optimizer is rebuilt from scratch; during phase 2 the
conv/linear weights become weight_orig * weight_mask (re-pruned to a higher sparsity each
round) and are made permanent with prune.remove at the end.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)

D = 32
PROTOS = torch.randn(12, D, generator=torch.Generator().manual_seed(5)) * 0.45


def make_task(classes, n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, len(classes), (n,), generator=g)
    x = PROTOS[torch.tensor(classes)[y]] + torch.randn(n, D, generator=g) * 1.2
    return TensorDataset(x, y)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 64), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class Classifier(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(64, n_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class EarlyStopping:
    def __init__(self, patience):
        self.patience, self.best, self.bad, self.best_state = patience, float("inf"), 0, None

    def __call__(self, val_loss, model):
        if val_loss < self.best - 1e-4:
            self.best, self.bad = val_loss, 0
            self.best_state = copy.deepcopy(model.state_dict())
        else:
            self.bad += 1
        return self.bad >= self.patience


def run_epoch(model, loader, opt):
    model.train()
    tot, n = 0.0, 0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tot += loss.item() * len(y)
        n += len(y)
    return tot / n


@torch.no_grad()
def evaluate(model, ds):
    model.eval()
    logits = model(ds.tensors[0])
    return F.cross_entropy(logits, ds.tensors[1]).item(), (logits.argmax(1) == ds.tensors[1]).float().mean().item()


# ---------------- phase 1: pretrain on 8 classes with early stopping ----------------
pre_train = make_task(list(range(8)), 640, 1)
pre_val = make_task(list(range(8)), 160, 2)   # small and noisy: validation loss bottoms out early
model = Classifier(8)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
stopper = EarlyStopping(patience=2)
loader = DataLoader(pre_train, batch_size=32, shuffle=True)
for epoch in range(15):
    tr = run_epoch(model, loader, opt)
    vl, va = evaluate(model, pre_val)
    print(f"[pretrain] epoch {epoch} train {tr:.4f} val {vl:.4f} acc {va:.3f}")
    if stopper(vl, model):
        print(f"[pretrain] early stop at epoch {epoch}, restoring best (val {stopper.best:.4f})")
        break
model.load_state_dict(stopper.best_state)

# ---------------- surgery: new head for a 4-class downstream task ----------------
model.head = nn.Linear(64, 4)
ft_train = make_task([8, 9, 10, 11], 512, 3)
ft_val = make_task([8, 9, 10, 11], 256, 4)
opt = torch.optim.SGD([
    {"params": model.backbone.parameters(), "lr": 0.01},
    {"params": model.head.parameters(), "lr": 0.05},
], momentum=0.9)
loader = DataLoader(ft_train, batch_size=32, shuffle=True)
to_prune = [(model.backbone.net[0], "weight"), (model.backbone.net[3], "weight"), (model.head, "weight")]

# ---------------- phase 2: fine-tune, pruning 30% more of the weights each round ----------------
for rnd, amount in enumerate([0.3, 0.3, 0.3]):
    prune.global_unstructured(to_prune, pruning_method=prune.L1Unstructured, amount=amount)
    for epoch in range(2):
        tr = run_epoch(model, loader, opt)
    vl, va = evaluate(model, ft_val)
    zeros = sum((m.weight == 0).sum().item() for m, _ in to_prune)
    total = sum(m.weight.numel() for m, _ in to_prune)
    print(f"[finetune] round {rnd} train {tr:.4f} val {vl:.4f} acc {va:.3f} sparsity {zeros / total:.2f}")

for m, name in to_prune:
    prune.remove(m, name)
print("pruning made permanent; params:", sorted(n for n, _ in model.named_parameters())[:3], "...")
print(f"final val acc {evaluate(model, ft_val)[1]:.3f}")
