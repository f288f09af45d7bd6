"""Deep Mutual Learning: two heterogeneous peer networks teaching each other (Lightning, manual opt).

Modelled on: chxy95/Deep-Mutual-Learning (``trainer.py``: a list of models, one SGD(nesterov)
optimizer and one StepLR per model; for every batch all peers run forward once, then for each
peer ``loss_i = CE + mean_j KL(p_j || p_i)`` is back-propagated and *that peer's* optimizer
steps), the PyTorch port of YingZhangDUT/Deep-Mutual-Learning (Zhang, Xiang, Hospedales & Lu,
"Deep Mutual Learning", CVPR 2018).

What is unusual about the loop (deliberate):
  * Two models and two optimizers in one LightningModule with ``automatic_optimization=False``;
    each batch triggers two ``zero_grad/manual_backward/step`` sequences, one per peer.
  * Each peer's loss uses the other peer's prediction as a soft target (detached); the second
    peer's target was computed *before* the first peer's step, as in the reference code.
  * The peers are different architectures (a small ResNet and a depthwise-separable
    MobileNet-style net) with different learning rates.
  * Gradient clipping is done by hand through ``self.clip_gradients`` (manual optimization),
    and both StepLR schedulers are stepped by hand at the end of each epoch.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 32, 2))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


class TinyMobileNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()

        def dw(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                 nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                      dw(16, 32, 2), dw(32, 64, 1))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class MutualLearning(L.LightningModule):
    def __init__(self, lrs=(0.05, 0.1), momentum=0.9, weight_decay=5e-4, step_size=1, gamma=0.3):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.models = nn.ModuleList([TinyResNet(), TinyMobileNet()])

    def forward(self, x, i=0):
        return self.models[i](x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        optimizers = self.optimizers()
        outputs = [m(images) for m in self.models]
        n = len(self.models)
        for i, opt in enumerate(optimizers):
            ce_loss = F.cross_entropy(outputs[i], labels)
            kl_loss = sum(F.kl_div(F.log_softmax(outputs[i], dim=1), F.softmax(outputs[j].detach(), dim=1),
                                   reduction="batchmean") for j in range(n) if j != i)
            loss = ce_loss + kl_loss / (n - 1)
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=2.0, gradient_clip_algorithm="norm")
            opt.step()
            acc = (outputs[i].argmax(1) == labels).float().mean()
            self.log_dict({f"train/loss_{i + 1}": loss, f"train/kl_{i + 1}": kl_loss, f"train/acc_{i + 1}": acc})
            if batch_idx % 10 == 0:
                print(f"epoch {self.current_epoch} batch {batch_idx:2d} model_{i + 1}: ce {ce_loss.item():.3f} "
                      f"kl {kl_loss.item():.3f} acc {acc.item():.3f} lr {opt.param_groups[0]['lr']:.3g}")

    def on_train_epoch_end(self):
        for sch in self.lr_schedulers():
            sch.step()

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        for i, m in enumerate(self.models):
            out = m(images)
            self.log(f"val/acc_{i + 1}", (out.argmax(1) == labels).float().mean())
            self.log(f"val/ce_{i + 1}", F.cross_entropy(out, labels))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            m = self.trainer.callback_metrics
            print(f"  [val epoch {self.current_epoch}] acc_1 {m['val/acc_1']:.3f} acc_2 {m['val/acc_2']:.3f} "
                  f"ce_1 {m['val/ce_1']:.3f} ce_2 {m['val/ce_2']:.3f}")

    def configure_optimizers(self):
        hp = self.hparams
        opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=hp.momentum, weight_decay=hp.weight_decay,
                                nesterov=True) for m, lr in zip(self.models, hp.lrs)]
        scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=hp.step_size, gamma=hp.gamma) for o in opts]
        return opts, scheds


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(99))
    protos = F.avg_pool2d(protos, 3, 1, 1) * 2
    y = torch.randint(0, 10, (n,), generator=g)
    x = protos[y] + torch.randn(n, 3, 16, 16, generator=g)
    return TensorDataset(x, y)


def main():
    L.seed_everything(3)
    train = DataLoader(make_data(640, 0), batch_size=32, shuffle=True)
    val = DataLoader(make_data(320, 1), batch_size=160)
    model = MutualLearning()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train, val)


if __name__ == "__main__":
    main()
