"""Training an ensemble of small MLPs at once with torch.func (vmap over functional_call).

Modelled on the PyTorch tutorial "Model ensembling" (torch.func: stack_module_state +
vmap(functional_call)), carried on from inference to training as asked in
pytorch/functorch issue "How to train an ensemble with vmap?".

Unusual loop: the trained tensors are not parameters of any nn.Module -- they are the
stacked leaf tensors returned by stack_module_state, the model used in forward lives on
the 'meta' device, and every member sees its own bootstrap batch in one vmapped call.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

torch.set_num_threads(1)
torch.manual_seed(0)

N_MODELS = 8
IN, HID, OUT = 20, 64, 3


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN, HID)
        self.fc2 = nn.Linear(HID, HID)
        self.fc3 = nn.Linear(HID, OUT)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g)
    w = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(123))
    logits = x @ w + 0.5 * torch.sin(3 * x[:, :OUT])
    return x, logits.argmax(1)


x_train, y_train = make_data(2048, 1)
x_val, y_val = make_data(512, 2)

members = [MLP() for _ in range(N_MODELS)]
params, buffers = stack_module_state(members)   # dict name -> [N_MODELS, ...] leaf tensors
base = copy.deepcopy(members[0]).to("meta")


def member_forward(p, b, x):
    return functional_call(base, (p, b), (x,))


ens_forward = vmap(member_forward)                       # separate batch per member
ens_forward_shared = vmap(member_forward, in_dims=(0, 0, None))  # same batch for all

opt = torch.optim.Adam(params.values(), lr=3e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=40, gamma=0.5)

BATCH = 64
g = torch.Generator().manual_seed(7)
for step in range(120):
    # bootstrap: each member draws its own indices
    idx = torch.randint(0, x_train.shape[0], (N_MODELS, BATCH), generator=g)
    xb, yb = x_train[idx], y_train[idx]                      # [M, B, IN], [M, B]
    logits = ens_forward(params, buffers, xb)                # [M, B, OUT]
    per_member = F.cross_entropy(logits.reshape(-1, OUT), yb.reshape(-1), reduction="none")
    loss = per_member.view(N_MODELS, BATCH).mean(1).sum()    # sum so each member gets its own mean-loss grad
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    if step % 20 == 0 or step == 119:
        with torch.no_grad():
            val_logits = ens_forward_shared(params, buffers, x_val)   # [M, N, OUT]
            member_acc = (val_logits.argmax(-1) == y_val).float().mean(1)
            ens_acc = (val_logits.softmax(-1).mean(0).argmax(-1) == y_val).float().mean()
        print(f"step {step:3d} loss/member {loss.item() / N_MODELS:.4f} "
              f"member acc {member_acc.mean():.3f} ensemble acc {ens_acc:.3f}")

# write the trained weights back into ordinary modules, as one would to export them
for i, m in enumerate(members):
    m.load_state_dict({k: v[i].detach().clone() for k, v in params.items()})
with torch.no_grad():
    check = members[3](x_val[:4])
    ref = functional_call(base, ({k: v[3] for k, v in params.items()}, {}), (x_val[:4],))
print("exported member matches:", torch.allclose(check, ref, atol=1e-6))
