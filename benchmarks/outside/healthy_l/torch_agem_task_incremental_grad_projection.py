"""A-GEM (Averaged Gradient Episodic Memory) on a split, task-incremental classification stream.

Modelled on: GMvandeVen/continual-learning (van de Ven, Tuytelaars & Tolias, "Three types of
incremental learning", Nature Machine Intelligence 2022), ``models/classifier.py``
``train_a_batch`` with ``AGEM=True`` (Chaudhry et al., ICLR 2019): the replayed memory batch of
every previous task is evaluated on that task's ``active_classes``, the averaged replay loss is
back-propagated and the gradient flattened into ``grad_rep``, then ``optimizer.zero_grad()``;
the current-task loss is back-propagated, and if ``angle = <grad_cur, grad_rep> < 0`` the
gradient is projected, ``grad_cur - angle / |grad_rep|^2 * grad_rep``, and copied back into every
``p.grad`` before ``optimizer.step()``.  The optimizer type ``adam_reset`` (Adam whose state is
reset at the start of every task) and the class-balanced exemplar memory follow that repository;
the data are a synthetic 10-class stream split into 5 two-class tasks.

Unusual (but intended) things about the loop:
* from the second task on, every step does two backward passes; the first one's gradients are
  only used as a constraint and are wiped before the second;
* ``p.grad`` is overwritten by hand (projection) on the steps where the constraint is
  violated, so the applied update is not the gradient of the reported loss;
* the loss jumps at every task boundary (new classes), the optimizer is rebuilt there, and the
  output layer is masked to the current task's classes (the other logits get no gradient
  from the current-task loss).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
np.random.seed(0)

N_TASKS, CLASSES_PER_TASK, N_FEATURES = 5, 2, 64


def make_stream(n_per_class, seed):
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(N_TASKS * CLASSES_PER_TASK, N_FEATURES, generator=torch.Generator().manual_seed(42))
    # classes within a task are close to each other (only a few features differ)
    for t in range(N_TASKS):
        delta = torch.randn(N_FEATURES, generator=torch.Generator().manual_seed(t))
        proto[2 * t + 1] = proto[2 * t] + 1.5 * delta * (torch.arange(N_FEATURES) < 16)
    xs, ys = [], []
    for c in range(N_TASKS * CLASSES_PER_TASK):
        xs.append(proto[c] + 1.0 * torch.randn(n_per_class, N_FEATURES, generator=g))
        ys.append(torch.full((n_per_class,), c))
    return torch.cat(xs), torch.cat(ys)


class Classifier(nn.Module):
    def __init__(self, fc_units=100, classes=N_TASKS * CLASSES_PER_TASK):
        super().__init__()
        self.fcE = nn.Sequential(nn.Linear(N_FEATURES, fc_units), nn.ReLU(), nn.Linear(fc_units, fc_units), nn.ReLU())
        self.classifier = nn.Linear(fc_units, classes)
        self.AGEM = True
        self.n_projections = 0

    def forward(self, x):
        return self.classifier(self.fcE(x))

    def train_a_batch(self, x, y, x_=None, y_=None, active_classes=None):
        self.train()
        self.optimizer.zero_grad()

        ##--(1)-- REPLAYED DATA --##
        if x_ is not None:
            n_replays = len(x_)
            loss_replay = [None] * n_replays
            for replay_id in range(n_replays):
                y_hat = self(x_[replay_id])[:, active_classes[replay_id]]
                loss_replay[replay_id] = F.cross_entropy(y_hat, y_[replay_id], reduction="mean")
            loss_replay = sum(loss_replay) / n_replays
            loss_replay.backward()
            grad_rep = torch.cat([p.grad.view(-1) for p in self.parameters() if p.requires_grad])
            # with A-GEM, gradients of replayed batch are only used as inequality constraint
            self.optimizer.zero_grad()

        ##--(2)-- CURRENT DATA --##
        y_hat = self(x)[:, active_classes[-1]]
        loss_cur = F.cross_entropy(input=y_hat, target=y, reduction="mean")
        precision = (y == y_hat.max(1)[1]).sum().item() / x.size(0)
        loss_cur.backward()

        if self.AGEM and x_ is not None:
            grad_cur = torch.cat([p.grad.view(-1) for p in self.parameters() if p.requires_grad])
            angle = (grad_cur * grad_rep).sum()
            if angle < 0:
                self.n_projections += 1
                length_rep = (grad_rep * grad_rep).sum()
                grad_proj = grad_cur - (angle / length_rep) * grad_rep
                index = 0
                for p in self.parameters():
                    if p.requires_grad:
                        n_param = p.numel()
                        p.grad.copy_(grad_proj[index:index + n_param].view_as(p))
                        index += n_param

        self.optimizer.step()
        return {"loss_current": loss_cur.item(),
                "loss_replay": loss_replay.item() if x_ is not None else 0.0, "precision": precision}


@torch.no_grad()
def validate(model, x, y, task):
    model.eval()
    classes = list(range(CLASSES_PER_TASK * task, CLASSES_PER_TASK * (task + 1)))
    mask = (y >= classes[0]) & (y <= classes[-1])
    y_hat = model(x[mask])[:, classes]
    return (y_hat.argmax(1) == (y[mask] - classes[0])).float().mean().item()


def main():
    train_x, train_y = make_stream(200, seed=0)
    test_x, test_y = make_stream(100, seed=1)
    model = Classifier()
    iters_per_task, batch_size, budget_per_class = 12, 32, 20
    memory_sets = []  # per class: exemplar tensor (class-balanced budget)
    g = torch.Generator().manual_seed(3)

    for task in range(N_TASKS):
        # optim_type 'adam_reset': a fresh Adam (state reset) at the start of every task
        model.optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.999))
        classes = list(range(CLASSES_PER_TASK * task, CLASSES_PER_TASK * (task + 1)))
        idx = torch.where((train_y >= classes[0]) & (train_y <= classes[-1]))[0]
        active_classes = [list(range(CLASSES_PER_TASK * t, CLASSES_PER_TASK * (t + 1))) for t in range(task + 1)]
        for it in range(iters_per_task):
            b = idx[torch.randint(0, len(idx), (batch_size,), generator=g)]
            x, y = train_x[b], train_y[b] - classes[0]
            x_ = y_ = None
            if task > 0:  # one replay batch per previous task, drawn from the exemplar memory
                x_, y_ = [], []
                for t in range(task):
                    mem = torch.cat(memory_sets[CLASSES_PER_TASK * t: CLASSES_PER_TASK * (t + 1)])
                    lab = torch.arange(CLASSES_PER_TASK).repeat_interleave(budget_per_class)
                    sel = torch.randint(0, len(mem), (batch_size // task + 1,), generator=g)
                    x_.append(mem[sel])
                    y_.append(lab[sel])
            out = model.train_a_batch(x, y, x_=x_, y_=y_, active_classes=active_classes)
            if it % 4 == 0 or it == iters_per_task - 1:
                print(f"task {task + 1} iter {it:2d}: loss_cur {out['loss_current']:.4f} "
                      f"loss_replay {out['loss_replay']:.4f} acc {out['precision']:.3f}")
        # add exemplars of the classes just learned (random selection, fixed budget per class)
        for c in classes:
            cidx = torch.where(train_y == c)[0]
            memory_sets.append(train_x[cidx[torch.randperm(len(cidx), generator=g)[:budget_per_class]]])
        accs = [validate(model, test_x, test_y, t) for t in range(task + 1)]
        print(f"after task {task + 1}: per-task test acc {[round(a, 3) for a in accs]} "
              f"mean {np.mean(accs):.3f}; projections so far {model.n_projections}")


if __name__ == "__main__":
    main()
