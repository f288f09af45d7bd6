"""Multi-task recommendation (MMoE: click / like / finish) with a mid-run checkpoint and resume.

Modelled on: PingoLH/CenterNet-HarDNet#10 "optimizer state_dict not stable when resuming from
checkpoint" (https://github.com/PingoLH/CenterNet-HarDNet/issues/10): the network creates one head
per entry of the ``heads`` dict, and the iteration order of that dict is not the same in the run that
resumes, so the parameter order changes and ``optimizer.load_state_dict`` (which matches state to
parameters by position, see pytorch/pytorch#1489 "Optimizer should track parameter names and not
id") hands each head the Adam moments of another head.  Heads with identical shapes (CenterNet's
``wh`` and ``reg``, here the ``like`` and ``finish`` towers) load without any error.  The fix asked
for in pytorch/pytorch#1489 is to match optimizer state by parameter *name*; the HarDNet issue's
alternative is a canonical (sorted) head order.
Model: MMoE (Ma et al., KDD 2018): shared experts, one softmax gate and one tower per task.

Unusual about the loop: training is interrupted at step 16 as a preemptible job would be.  The run
saves model + optimizer + its options (serialised with ``json.dumps(..., sort_keys=True)``), then a
fresh process-like block rebuilds everything from the checkpoint and continues to step 40.  The
rebuilt ``heads`` dict comes back in sorted key order.  ``--healthy`` re-keys the saved optimizer
state by parameter name before loading it.
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)

# ----------------------------------------------------------------------------- synthetic logs
N_USERS, N_ITEMS, N_DENSE, N = 500, 300, 8, 6000
rng = np.random.default_rng(0)
u_f, i_f = rng.normal(size=(N_USERS, 6)), rng.normal(size=(N_ITEMS, 6))
users, items = rng.integers(0, N_USERS, N), rng.integers(0, N_ITEMS, N)
dense = rng.normal(size=(N, N_DENSE)).astype(np.float32)
aff = (u_f[users] * i_f[items]).sum(1) / 2.0
click = rng.uniform(size=N) < 1 / (1 + np.exp(-(aff + 0.5 * dense[:, 0] - 0.5)))
like = click & (rng.uniform(size=N) < 1 / (1 + np.exp(-(aff - 0.8 + dense[:, 1]))))
finish = click & (rng.uniform(size=N) < 1 / (1 + np.exp(-(0.6 - 0.8 * dense[:, 2] + 0.3 * aff))))
labels = {"ctr": click, "like": like, "finish": finish}
ds = torch.utils.data.TensorDataset(torch.from_numpy(users), torch.from_numpy(items), torch.from_numpy(dense),
                                    *[torch.from_numpy(labels[t].astype(np.float32)) for t in ("ctr", "like", "finish")])


class MMoE(nn.Module):
    def __init__(self, heads, n_experts=4, d_emb=16, d_expert=32):
        super().__init__()
        self.user_emb = nn.Embedding(N_USERS, d_emb)
        self.item_emb = nn.Embedding(N_ITEMS, d_emb)
        d_in = 2 * d_emb + N_DENSE
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d_in, d_expert), nn.ReLU()) for _ in range(n_experts)])
        self.gates, self.towers = nn.ModuleDict(), nn.ModuleDict()
        for task in heads:
            self.gates[task] = nn.Linear(d_in, n_experts)
            self.towers[task] = nn.Sequential(nn.Linear(d_expert, 16), nn.ReLU(), nn.Linear(16, heads[task]))

    def forward(self, u, i, x):
        h = torch.cat([self.user_emb(u), self.item_emb(i), x], 1)
        e = torch.stack([exp(h) for exp in self.experts], 1)  # B x E x D
        out = {}
        for task in self.towers:
            w = torch.softmax(self.gates[task](h), -1).unsqueeze(-1)
            out[task] = self.towers[task]((w * e).sum(1)).squeeze(-1)
        return out


def run(opt, ckpt_path, start_step, stop_step, resume):
    model = MMoE(opt["heads"])
    optimizer = torch.optim.Adam(model.parameters(), lr=opt["lr"])
    if resume:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])  # by name: fine
        osd = remap_by_name(ckpt, model) if HEALTHY else ckpt["optimizer"]
        optimizer.load_state_dict(osd)  # matched by position
        start_step = ckpt["step"]
        moments_check(model, optimizer, ckpt)
        if not HEALTHY:
            print(f"ONSET step {start_step}")
    gen = torch.Generator().manual_seed(1000 + start_step)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, generator=gen)
    step = start_step
    while step < stop_step:
        for u, i, x, y_ctr, y_like, y_fin in loader:
            if step >= stop_step:
                break
            out = model(u, i, x)
            ys = {"ctr": y_ctr, "like": y_like, "finish": y_fin}
            losses = {t: F.binary_cross_entropy_with_logits(out[t], ys[t]) for t in out}
            loss = sum(opt["weights"][t] * losses[t] for t in losses)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 8 == 0:
                print(f"step {step:3d} " + " ".join(f"{t} {v.item():.4f}" for t, v in losses.items()))
            step += 1
    if not resume:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "names": [n for n, _ in model.named_parameters()],
                    "opt": json.dumps(opt, sort_keys=True)}, ckpt_path)
    return model


MISMATCH = {}


def remap_by_name(ckpt, model):
    """Re-index the saved optimizer state so that it follows the new model's parameter order."""
    osd = ckpt["optimizer"]
    old_index = {n: k for k, n in enumerate(ckpt["names"])}
    new_names = [n for n, _ in model.named_parameters()]
    state = {j: osd["state"][old_index[n]] for j, n in enumerate(new_names) if old_index[n] in osd["state"]}
    groups = [dict(osd["param_groups"][0], params=list(range(len(new_names))))]
    return {"state": state, "param_groups": groups}


def moments_check(model, optimizer, ckpt):
    """Compare the Adam moments each named parameter got after the load with the ones it had."""
    saved = dict(zip(ckpt["names"], [ckpt["optimizer"]["state"][k] for k in range(len(ckpt["names"]))]))
    wrong, worst = 0, 0.0
    for n, p in model.named_parameters():
        got = optimizer.state[p]["exp_avg_sq"]
        diff = (got - saved[n]["exp_avg_sq"]).abs().max().item() / (saved[n]["exp_avg_sq"].abs().max().item() + 1e-12)
        wrong += diff > 1e-6
        worst = max(worst, diff)
    MISMATCH.update(wrong=wrong, total=len(ckpt["names"]), worst=worst)


@torch.no_grad()
def auc(model):
    u, i, x = ds.tensors[0][-2000:], ds.tensors[1][-2000:], ds.tensors[2][-2000:]
    out, res = model(u, i, x), {}
    for k, t in enumerate(("ctr", "like", "finish")):
        y, s = ds.tensors[3 + k][-2000:], out[t]
        pos, neg = s[y == 1], s[y == 0]
        res[t] = (pos[:, None] > neg[None, :]).float().mean().item()
    return res


# options as given on the command line for the first launch
opt = {"heads": {"ctr": 1, "like": 1, "finish": 1}, "lr": 2e-3, "weights": {"ctr": 1.0, "like": 1.0, "finish": 1.0}}
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model_last.pth")
    run(opt, path, 0, 16, resume=False)  # preempted at step 16
    # --- relaunch: options are read back from the checkpoint ---
    resumed_opt = json.loads(torch.load(path, weights_only=False)["opt"])
    model = run(resumed_opt, path, 0, 40, resume=True)

print("held-out AUC " + " ".join(f"{k} {v:.3f}" for k, v in auc(model).items()))
print(f"EVIDENCE parameters whose Adam moments changed across the resume: {MISMATCH['wrong']}/{MISMATCH['total']} "
      f"(max relative exp_avg_sq mismatch {MISMATCH['worst']:.3f})")
