"""Stochastic Weight Averaging of a small ResNet trained in channels_last with bf16
autocast on CPU.

Modelled on the PyTorch blog post "PyTorch 1.6 now includes Stochastic Weight Averaging"
and the torch.optim.swa_utils documentation recipe (AveragedModel, SWALR with a cosine
anneal, swa_start epoch, update_bn over the train loader at the end), run the way the
PyTorch CPU performance tuning guide suggests (memory_format=torch.channels_last,
torch.autocast("cpu", dtype=torch.bfloat16)).

Unusual loop: two schedulers hand over at swa_start (CosineAnnealingLR before, SWALR
after), a second model (the running average) is updated after every optimizer step from
epoch swa_start on, and its BatchNorm statistics are recomputed from scratch by update_bn
before evaluation; activations are bf16 while the weights and optimizer stay fp32.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)


def make_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 6, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) * 1.5
    # class = (dominant colour channel, horizontal vs vertical stripes)
    ch, orient = y % 3, y // 3
    stripes = (torch.arange(16) % 4 < 2).float()
    for i in range(n):
        pat = stripes.view(1, 16).expand(16, 16) if orient[i] == 0 else stripes.view(16, 1).expand(16, 16)
        x[i, ch[i]] += 0.9 * pat
    return TensorDataset(x, y)


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.c1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c_out)
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2))
        self.head = nn.Linear(32, 6)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


train_set, test_set = make_images(1024, 1), make_images(384, 2)
train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
test_loader = DataLoader(test_set, batch_size=128)

model = Net().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
EPOCHS, SWA_START = 8, 5
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
swa_model = AveragedModel(model)
swa_sched = SWALR(opt, swa_lr=0.02, anneal_epochs=1, anneal_strategy="cos")


def evaluate(m):
    m.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x, y in test_loader:
            correct += (m(x.to(memory_format=torch.channels_last)).argmax(1) == y).sum().item()
    return correct / len(test_set)


for epoch in range(EPOCHS):
    model.train()
    tot, n = 0.0, 0
    for x, y in train_loader:
        x = x.to(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if epoch >= SWA_START:
            swa_model.update_parameters(model)
        tot += loss.item() * x.size(0)
        n += x.size(0)
    if epoch >= SWA_START:
        swa_sched.step()
    else:
        cosine.step()
    print(f"epoch {epoch} lr {opt.param_groups[0]['lr']:.3f} loss {tot / n:.4f} acc {evaluate(model):.3f}")


def channels_last_batches(loader):
    for x, _ in loader:
        yield x.to(memory_format=torch.channels_last)


with torch.autocast("cpu", dtype=torch.bfloat16):
    update_bn(channels_last_batches(train_loader), swa_model)
print(f"SWA model acc {evaluate(swa_model):.3f} (averaged {swa_model.n_averaged.item()} snapshots)")
