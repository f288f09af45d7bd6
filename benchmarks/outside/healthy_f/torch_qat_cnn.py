"""Eager-mode quantization-aware training of a small CNN with torch.ao.quantization.

Modelled on the PyTorch tutorial "(beta) Static Quantization with Eager Mode in PyTorch",
section "Quantization-aware training" (QuantStub/DeQuantStub, fuse_modules_qat,
get_default_qat_qconfig, prepare_qat, freeze observers and BatchNorm statistics after a few
epochs, convert to int8 and evaluate).

Unusual loop: the forward runs fake-quantize modules whose observers update buffers on
every step; mid-training the observers are disabled and BatchNorm is switched to frozen
running statistics with model.apply(...) while training continues; the final int8 model
is produced by convert() on a deep copy and evaluated.
"""
import copy
import warnings

import torch
import torch.ao.quantization as tq
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")  # torch.ao.quantization deprecation notices
torch.manual_seed(0)
torch.backends.quantized.engine = "qnnpack" if "fbgemm" not in torch.backends.quantized.supported_engines else "fbgemm"


def make_images(n, seed):
    """10 classes: a 4x4 bright patch at one of 10 positions on a 16x16 grey image."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.rand(n, 1, 16, 16, generator=g) * 0.6
    for k in range(10):
        r, c = divmod(k, 5)
        x[y == k, :, 2 + r * 7:6 + r * 7, 1 + c * 3:4 + c * 3] += 0.8
    return TensorDataset(x, y)


class QATNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc = nn.Linear(32 * 16, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        x = self.pool(x).flatten(1)
        return self.dequant(self.fc(x))


train_loader = DataLoader(make_images(1536, 1), batch_size=64, shuffle=True)
test_set = make_images(512, 2)

model = QATNet()
model.train()
model.qconfig = tq.get_default_qat_qconfig(torch.backends.quantized.engine)
tq.fuse_modules_qat(model, [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"]], inplace=True)
tq.prepare_qat(model, inplace=True)

opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4 * len(train_loader))


def accuracy(m, ds):
    m.eval()
    with torch.no_grad():
        return (m(ds.tensors[0]).argmax(1) == ds.tensors[1]).float().mean().item()


for epoch in range(4):
    model.train()
    if epoch == 2:
        model.apply(tq.disable_observer)                  # freeze quantizer ranges
    if epoch == 3:
        model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)  # use running BN stats from now on
    tot, n = 0.0, 0
    for x, y in train_loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        tot += loss.item() * x.size(0)
        n += x.size(0)
    print(f"epoch {epoch} loss {tot / n:.4f} fake-quant acc {accuracy(model, test_set):.3f}")

int8_model = tq.convert(copy.deepcopy(model).eval(), inplace=False)
print(f"int8 acc {accuracy(int8_model, test_set):.3f}  conv1 type: {type(int8_model.conv1).__name__}")
