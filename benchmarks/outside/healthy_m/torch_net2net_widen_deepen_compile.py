"""Net2Net: train a small MLP, grow it function-preservingly (wider + deeper), continue with a compiled student.

Modelled on: Chen, Goodfellow & Shlens, "Net2Net: Accelerating Learning via Knowledge Transfer"
(ICLR 2016) as implemented in erogol/Net2Net ``net2net.py``: ``wider(m1, m2, new_width, bnorm,
noise)`` copies the old units, picks a random old unit ``idx`` for every new one (``tracking``
dict), copies its incoming weights/bias/BatchNorm statistics, divides the outgoing weights of all
replicas of ``idx`` by the replication count and adds a little noise to break symmetry;
``deeper(m, nonlin, bnorm_flag)`` inserts a Linear initialised to the identity (and a BatchNorm with
running_mean 0 / running_var 1) after a ReLU. As in the paper, the student gets a new optimizer with
a lower learning rate than the teacher.

Unusual but correct: the network is replaced in the middle of the run by a bigger one (parameter
count and shapes change, new optimizer, momentum buffers start from zero); the new hidden layer
starts as an exact identity and the replicated units start as exact copies (their outgoing weights
are halved), which the program checks by comparing the teacher's and the student's eval-mode outputs
before adding the symmetry-breaking noise; the student is wrapped with ``torch.compile`` for the
second phase; the training RNG is re-seeded before each evaluation pass.
"""
import copy
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

N_IN, N_CLASSES = 20, 5


class MLP(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.fc1 = nn.Linear(N_IN, width)
        self.bn1 = nn.BatchNorm1d(width)
        self.fc2 = nn.Linear(width, width)
        self.mid = nn.Identity()                       # replaced by deeper()
        self.fc3 = nn.Linear(width, N_CLASSES)

    def forward(self, x):
        h = F.relu(self.bn1(self.fc1(x)))
        h = F.relu(self.fc2(h))
        return self.fc3(self.mid(h))


@torch.no_grad()
def wider(m1, m2, new_width, bnorm=None, rng=None):
    """Function-preserving widening of layer m1 (out units) and the following layer m2 (in units)."""
    old_width = m1.out_features
    w1, b1, w2 = m1.weight.data, m1.bias.data, m2.weight.data
    nw1 = w1.new_zeros(new_width, w1.size(1))
    nb1 = b1.new_zeros(new_width)
    nw2 = w2.new_zeros(w2.size(0), new_width)
    nw1[:old_width], nb1[:old_width], nw2[:, :old_width] = w1, b1, w2
    if bnorm is not None:
        stats = {k: getattr(bnorm, k).data for k in ("weight", "bias", "running_mean", "running_var")}
        nstats = {k: v.new_zeros(new_width) for k, v in stats.items()}
        for k in stats:
            nstats[k][:old_width] = stats[k]
    tracking = {}
    for i in range(old_width, new_width):
        idx = int(rng.integers(0, old_width))
        tracking.setdefault(idx, [idx]).append(i)
        nw1[i], nb1[i], nw2[:, i] = w1[idx], b1[idx], w2[:, idx]
        if bnorm is not None:
            for k in stats:
                nstats[k][i] = stats[k][idx]
    for idx, replicas in tracking.items():
        for item in replicas:
            nw2[:, item] /= len(replicas)
    new_m1 = nn.Linear(m1.in_features, new_width)
    new_m2 = nn.Linear(new_width, m2.out_features)
    new_m1.weight.data, new_m1.bias.data = nw1, nb1
    new_m2.weight.data, new_m2.bias.data = nw2, m2.bias.data.clone()
    new_bn = None
    if bnorm is not None:
        new_bn = nn.BatchNorm1d(new_width, momentum=bnorm.momentum)
        for k, v in nstats.items():
            getattr(new_bn, k).data.copy_(v)
        new_bn.num_batches_tracked.copy_(bnorm.num_batches_tracked)
    return new_m1, new_m2, new_bn, tracking


@torch.no_grad()
def deeper(width, bnorm_flag=True):
    """Identity Linear (+ BatchNorm in its identity state) + ReLU, inserted after a ReLU."""
    m2 = nn.Linear(width, width)
    m2.weight.data.copy_(torch.eye(width))
    m2.bias.data.zero_()
    layers = [m2]
    if bnorm_flag:
        bn = nn.BatchNorm1d(width)
        bn.weight.data.fill_(1)
        bn.bias.data.fill_(0)
        bn.running_mean.fill_(0)
        bn.running_var.fill_(1)
        layers.append(bn)
    layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_data(n, seed):
    g = np.random.default_rng(seed)
    centers = np.random.default_rng(7).normal(0, 1.2, (N_CLASSES, N_IN))
    y = g.integers(0, N_CLASSES, n)
    x = centers[y] + g.standard_normal((n, N_IN))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def train(model, opt, x, y, steps, bs, tag):
    model.train()
    for step in range(steps):
        idx = torch.randint(0, len(x), (bs,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            print(f"[{tag}] step {step:2d} loss {loss.item():.4f}")


@torch.no_grad()
def evaluate(model, x, y):
    state = torch.get_rng_state()
    torch.manual_seed(1234)                    # reproducible eval, then give the training RNG back
    model.eval()
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    torch.set_rng_state(state)
    return acc


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = make_data(2048, 1)
    xv, yv = make_data(512, 2)

    teacher = MLP(width=16)
    opt = torch.optim.SGD(teacher.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    train(teacher, opt, x, y, steps=25, bs=64, tag="teacher")
    print(f"teacher val acc {evaluate(teacher, xv, yv):.3f}")

    # ---- grow: fc1/bn1 16 -> 32, fc2 16 -> 32, identity layer after fc2 -----------------------
    student = copy.deepcopy(teacher)
    student.fc1, student.fc2, student.bn1, _ = wider(teacher.fc1, teacher.fc2, 32, bnorm=teacher.bn1, rng=rng)
    student.fc2, student.fc3, _, _ = wider(student.fc2, teacher.fc3, 32, rng=rng)
    student.mid = deeper(32)
    teacher.eval(), student.eval()
    with torch.no_grad():
        gap = (teacher(xv) - student(xv)).abs().max().item()
    # exact up to the eps of the inserted BatchNorm: x / sqrt(1 + 1e-5)
    assert gap < 1e-3, f"Net2Net transform should preserve the function (gap {gap})"
    with torch.no_grad():                       # break the symmetry between replicated units
        for m in (student.fc1, student.fc2):
            m.weight.add_(torch.randn_like(m.weight) * 1e-2 * m.weight.std())
        gap_noise = (teacher(xv) - student(xv)).abs().max().item()
    n_t = sum(p.numel() for p in teacher.parameters())
    n_s = sum(p.numel() for p in student.parameters())
    print(f"student: {n_t} -> {n_s} params, max output gap {gap:.1e} (exact), {gap_noise:.1e} (after noise), "
          f"val acc {evaluate(student, xv, yv):.3f}")

    # ---- continue training the student with a new optimizer, compiled ---------------------
    opt = torch.optim.SGD(student.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    compiled = torch.compile(student)
    t0 = time.time()
    train(compiled, opt, x, y, steps=30, bs=64, tag="student")
    print(f"student phase took {time.time() - t0:.1f}s (incl. compilation); "
          f"val acc {evaluate(student, xv, yv):.3f}")   # eager module, same parameters


if __name__ == "__main__":
    main()
