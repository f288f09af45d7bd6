"""Data Valuation using Reinforcement Learning (DVRL, Yoon, Arik & Pfister, ICML 2020) on a
tabular credit-default dataset with 25 % flipped training labels.  A value estimator scores
every training sample; in each outer iteration a predictor is trained *from scratch* on the
samples selected by Bernoulli draws from those scores, its validation accuracy minus a
baseline is the reward, and the value estimator is updated with REINFORCE.

Modelled on: DerrickXuNu/dvrl_pytorch issue #2 ("Line 155 in dvrl.py: `copy.copy()` should be
`copy.deepcopy()` otherwise the code is modifying `self.pred_model`").  In ``train_dvrl`` the
comment says "train predictor from scratch everytime" but ``new_model = copy.copy(self.pred_model)``
is a shallow copy: the new module shares the ``_parameters`` dict with ``self.pred_model``,
so every outer iteration keeps training the same predictor instead of starting from the
untrained initialisation, and the rewards stop measuring the quality of the selection.
The first outer iteration is unaffected; the value-estimator updates of the second outer
iteration are the first wrong ones.

Unusual about the loop: two pre-trained helper models (``ori_model`` on the noisy train set
for the baseline, ``val_model`` on the clean validation set for the ``y_pred_diff`` input),
a predictor and its Adam re-created every outer iteration, and the value estimator updated
once per stored inner mini-batch (6 REINFORCE steps per outer iteration, same reward),
with the DVRL regulariser that keeps the mean selection probability inside [1-t, t].
The main optimizer is ``dvrl_optimizer`` (value estimator).
Run: python p05_dvrl_tabular_shallow_copy_predictor.py [--healthy]
"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

N_TRAIN, N_VAL, D, BATCH = 600, 300, 10, 100
OUTER, INNER_EPOCHS, LR, INNER_LR = 6, 2, 1e-2, 1e-2


def make_credit_data(n, g, flip=0.0):
    x = torch.randn(n, D, generator=g)
    w = torch.linspace(-1.5, 1.5, D)
    y = ((x @ w + 0.5 * x[:, 0] * x[:, 1]) > 0).long()
    noisy = torch.rand(n, generator=g) < flip
    y_obs = torch.where(noisy, 1 - y, y)
    return x, y_obs, noisy


class Predictor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.net(x)


class ValueEstimator(nn.Module):
    def __init__(self, hidden=32, comb=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D + 1, hidden), nn.ReLU(), nn.Linear(hidden, comb), nn.ReLU())
        self.comb = nn.Sequential(nn.Linear(comb + 1, comb), nn.ReLU(), nn.Linear(comb, 1))

    def forward(self, x, y, y_pred_diff):
        h = self.body(torch.cat([x, y.float()], 1))
        return torch.sigmoid(self.comb(torch.cat([h, y_pred_diff], 1)))


def dvrl_loss(est_dv, s_input, reward, epsilon=1e-8, threshold=0.9):
    prob = torch.sum(s_input * torch.log(est_dv + epsilon) + (1 - s_input) * torch.log(1 - est_dv + epsilon))
    return (-reward * prob + 1e3 * (F.relu(est_dv.mean() - threshold) + F.relu((1 - threshold) - est_dv.mean())))


def pretrain(model, x, y, steps=60):
    opt = torch.optim.Adam(model.parameters(), lr=INNER_LR)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


g = torch.Generator().manual_seed(1)
x_tr, y_tr, noisy_tr = make_credit_data(N_TRAIN, g, flip=0.25)
x_val, y_val, _ = make_credit_data(N_VAL, g)

pred_model = Predictor()
initial_state = copy.deepcopy(pred_model.state_dict())
ori_model = pretrain(copy.deepcopy(pred_model), x_tr, y_tr)
val_model = pretrain(copy.deepcopy(pred_model), x_val, y_val)
valid_perf = accuracy(ori_model, x_val, y_val)
print(f"Origin model performance (acc): {valid_perf:.4f}")

value_estimator = ValueEstimator()
dvrl_optimizer = torch.optim.Adam(value_estimator.parameters(), lr=LR)
sel_g = torch.Generator().manual_seed(2)
step, start_gap = 0, []
for epoch in range(OUTER):
    # train predictor from scratch everytime
    new_model = copy.deepcopy(pred_model) if args.healthy else copy.copy(pred_model)
    gap = max((p - initial_state[n]).abs().max().item() for n, p in new_model.state_dict().items())
    start_gap.append(gap)
    pre_optimizer = torch.optim.Adam(new_model.parameters(), lr=INNER_LR)
    stored = []
    for inner in range(INNER_EPOCHS):
        perm = torch.randperm(N_TRAIN, generator=sel_g)
        for i in range(0, N_TRAIN, BATCH):
            b = perm[i:i + BATCH]
            feature, label = x_tr[b], y_tr[b]
            with torch.no_grad():
                y_pred_diff = torch.abs(F.one_hot(label, 2) - F.softmax(val_model(feature), 1))[:, :1]
                est_dv_curr = value_estimator(feature, label[:, None], y_pred_diff)
            sel_prob_curr = torch.bernoulli(est_dv_curr, generator=sel_g)
            if inner == INNER_EPOCHS - 1:
                stored.append((feature, label, y_pred_diff, sel_prob_curr))
            new_model.train()
            pre_optimizer.zero_grad()
            loss = F.cross_entropy(new_model(feature), label, reduction="none") * sel_prob_curr.squeeze(1)
            loss.mean().backward()
            pre_optimizer.step()
    dvrl_perf = accuracy(new_model, x_val, y_val)
    reward = dvrl_perf - valid_perf
    # update the selection network, one stored mini-batch at a time
    value_estimator.train()
    for feature, label, y_pred_diff, s_input in stored:
        if epoch == 1 and step == 6 and not args.healthy:
            print(f"ONSET step {step}")
        dvrl_optimizer.zero_grad()
        est = value_estimator(feature, label[:, None], y_pred_diff)
        loss = dvrl_loss(est, s_input, reward)
        loss.backward()
        dvrl_optimizer.step()
        step += 1
    with torch.no_grad():
        dv = value_estimator(x_tr, y_tr[:, None], torch.abs(F.one_hot(y_tr, 2) - F.softmax(val_model(x_tr), 1))[:, :1]).squeeze(1)
    print(f"outer {epoch} steps {step - len(stored)}-{step - 1} predictor_start_gap {gap:.4f} dvrl_acc {dvrl_perf:.4f} "
          f"reward {reward:+.4f} mean_value clean {dv[~noisy_tr].mean():.3f} noisy {dv[noisy_tr].mean():.3f}")

drift = max((p - initial_state[n]).abs().max().item() for n, p in pred_model.state_dict().items())
print(f"EVIDENCE max |predictor weights at start of outer iteration - untrained init| over iterations {max(start_gap):.4f}; "
      f"self.pred_model drifted by {drift:.4f}; mean data value clean {dv[~noisy_tr].mean():.3f} vs noisy {dv[noisy_tr].mean():.3f}")
