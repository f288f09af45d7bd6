"""P02 (class: gradients not cleared -- zero_grad() called on the wrong object) -- plain loop.

Modelled on the public repo Mikoto10032/AutomaticWeightedLoss (learnable multi-task loss
weights, Liebel & Koerner's variant of Kendall et al.'s uncertainty weighting): the
weights live in a separate `AutomaticWeightedLoss` nn.Module whose parameters are added
to the optimizer as an extra param group, and its README loop clears gradients with
`optimizer.zero_grad()`.  Many training loops instead call `model.zero_grad()` (the two
are only equivalent when the optimizer holds exactly the model's parameters; cf. the
StackOverflow question "Why do we need to call zero_grad() in PyTorch?", q. 48001598, on
gradient accumulation).  `model.zero_grad()` never touches the loss module's `params`.

Schedule: the first 12 steps use fixed, equal task weights (the learnable weights are not
in the graph yet, so their .grad stays None).  From step 12 the automatic weighting is
switched on; from then on the loss-weight gradients are never cleared and are summed over
all later steps, so every optimizer step from 13 on uses a stale, growing gradient for
them.  ONSET is printed at step 13, the first step whose update differs.
Healthy twin: `optimizer.zero_grad()` (clears every parameter the optimizer owns).
"""
import sys, math
import torch, torch.nn as nn, torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)

TOTAL_STEPS = 36
AWL_START = 12           # learnable task weighting switched on after the warm-up
EVAL_EVERY = 9
BATCH = 64


class AutomaticWeightedLoss(nn.Module):
    """0.5 / sigma_i^2 * L_i + log(1 + sigma_i^2)  (same form as the public implementation)."""

    def __init__(self, num=2):
        super().__init__()
        self.params = nn.Parameter(torch.ones(num, requires_grad=True))

    def forward(self, *losses):
        loss_sum = 0
        for i, loss in enumerate(losses):
            loss_sum = loss_sum + 0.5 / (self.params[i] ** 2) * loss + torch.log(1 + self.params[i] ** 2)
        return loss_sum


class MultiTaskNet(nn.Module):
    """Shared trunk; classification head (scene class) + regression head (depth-like target)."""

    def __init__(self, d_in=24, n_cls=6):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, 128), nn.LayerNorm(128), nn.GELU(),
                                   nn.Linear(128, 128), nn.GELU())
        self.cls_head = nn.Sequential(nn.Linear(128, 64), nn.GELU(), nn.Linear(64, n_cls))
        self.reg_head = nn.Sequential(nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 4))

    def forward(self, x):
        h = self.trunk(x)
        return self.cls_head(h), self.reg_head(h)


# synthetic multi-task data: both targets depend on a shared latent
g = torch.Generator().manual_seed(42)
W_lat = torch.randn(24, 8, generator=g)
W_cls = torch.randn(8, 6, generator=g)
W_reg = torch.randn(8, 4, generator=g)


def make_batch(n, gen):
    x = torch.randn(n, 24, generator=gen)
    lat = torch.tanh(x @ W_lat / 3)
    y_cls = (lat @ W_cls + 0.3 * torch.randn(n, 6, generator=gen)).argmax(1)
    y_reg = 2.0 * (lat @ W_reg) + 0.5 * torch.randn(n, 4, generator=gen)   # different scale on purpose
    return x, y_cls, y_reg


val_gen = torch.Generator().manual_seed(99)
val_batches = [make_batch(256, val_gen) for _ in range(2)]


@torch.no_grad()
def evaluate(model):
    model.eval()
    correct = total = 0
    se = 0.0
    for x, yc, yr in val_batches:
        pc, pr = model(x)
        correct += (pc.argmax(1) == yc).sum().item()
        total += len(yc)
        se += F.mse_loss(pr, yr, reduction="sum").item() / 4
    model.train()
    return correct / total, math.sqrt(se / total)


model = MultiTaskNet()
awl = AutomaticWeightedLoss(2)
optimizer = torch.optim.SGD([
    {"params": model.parameters()},
    {"params": awl.parameters(), "weight_decay": 0},
], lr=0.05, momentum=0.9, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: min(1.0, (s + 1) / 4) * 0.5 * (1 + math.cos(math.pi * s / TOTAL_STEPS)))

train_gen = torch.Generator().manual_seed(1)
model.train()
for step in range(TOTAL_STEPS):
    if not HEALTHY and step == AWL_START + 1:
        print("ONSET step", step)
    x, y_cls, y_reg = make_batch(BATCH, train_gen)

    if HEALTHY:
        optimizer.zero_grad()
    else:
        model.zero_grad()

    logits, reg = model(x)
    l_cls = F.cross_entropy(logits, y_cls)
    l_reg = F.mse_loss(reg, y_reg)
    if step < AWL_START:
        loss = l_cls + l_reg                       # warm-up: fixed equal weights
    else:
        loss = awl(l_cls, l_reg)                   # learned uncertainty weighting
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
    scheduler.step()

    if step % 3 == 0 or step == TOTAL_STEPS - 1:
        w = (0.5 / awl.params.detach() ** 2).tolist()
        print(f"step {step:2d} loss {loss.item():8.4f} cls {l_cls.item():.4f} reg {l_reg.item():8.4f} "
              f"task_w [{w[0]:.3f}, {w[1]:.3f}] lr {scheduler.get_last_lr()[0]:.4f}")
    if (step + 1) % EVAL_EVERY == 0:
        acc, rmse = evaluate(model)
        print(f"  [eval] step {step} acc {acc:.3f} rmse {rmse:.3f}")
