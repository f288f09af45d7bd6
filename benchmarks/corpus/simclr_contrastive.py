"""SimCLR contrastive pre-training of a small convnet on synthetic images, two augmented views per image.

Modelled on: sthalles/SimCLR (https://github.com/sthalles/SimCLR, simclr.py, run.py,
models/resnet_simclr.py, data_aug/contrastive_learning_dataset.py)
Habits reproduced: a ``ContrastiveLearningViewGenerator`` returning ``n_views`` augmented
copies, views concatenated with ``torch.cat(images, dim=0)``, a backbone whose ``fc`` is replaced
by an MLP projection head, ``info_nce_loss`` built from a label matrix with the diagonal masked
out and positives/negatives gathered into CrossEntropy logits divided by a temperature, top-1/5
accuracy of the contrastive task logged every ``log_every_n_steps``, Adam with weight decay,
CosineAnnealingLR stepped once per epoch only after ten warm-up epochs (here: ``--warmup-epochs``),
``torch.autocast``/``GradScaler`` created with ``enabled=args.fp16_precision`` (off by default),
and a final ``save_checkpoint`` of epoch, arch, state and optimizer dicts.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SmallConvNet(nn.Module):
    """A four-layer convnet standing in for torchvision's ResNet-18."""

    def __init__(self, num_classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class ResNetSimCLR(nn.Module):
    def __init__(self, base_model, out_dim):
        super(ResNetSimCLR, self).__init__()
        self.backbone = {"convnet": SmallConvNet}[base_model](num_classes=out_dim)
        dim_mlp = self.backbone.fc.in_features

        # add mlp projection head
        self.backbone.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.backbone.fc)

    def forward(self, x):
        return self.backbone(x)


class ContrastiveLearningViewGenerator(object):
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform, n_views=2):
        self.base_transform = base_transform
        self.n_views = n_views

    def __call__(self, x):
        return [self.base_transform(x) for i in range(self.n_views)]


def simclr_transform(size, generator):
    """Random resized crop, horizontal flip, brightness/contrast jitter and random grayscale."""

    def transform(img):
        scale = 0.5 + 0.5 * torch.rand(1, generator=generator).item()
        crop = max(4, int(size * scale))
        top, left = torch.randint(0, size - crop + 1, (2,), generator=generator).tolist()
        out = img[:, top:top + crop, left:left + crop].unsqueeze(0)
        out = F.interpolate(out, size=(size, size), mode="bilinear", align_corners=False).squeeze(0)
        if torch.rand(1, generator=generator).item() < 0.5:
            out = out.flip(-1)
        brightness, contrast = (0.6 + 0.8 * torch.rand(2, generator=generator)).tolist()
        out = ((out - out.mean()) * contrast + out.mean()) * brightness
        if torch.rand(1, generator=generator).item() < 0.2:
            out = out.mean(0, keepdim=True).expand(3, size, size)
        return out.clamp(0, 1)

    return transform


class SyntheticImages(Dataset):
    def __init__(self, n, size, seed, transform):
        generator = torch.Generator().manual_seed(seed)
        self.data = torch.rand(n, 3, size // 4, size // 4, generator=generator)
        self.data = F.interpolate(self.data, size=(size, size), mode="nearest")
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.transform(self.data[index]), 0


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))

        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


class SimCLR(object):
    def __init__(self, *args, **kwargs):
        self.args = kwargs["args"]
        self.model = kwargs["model"]
        self.optimizer = kwargs["optimizer"]
        self.scheduler = kwargs["scheduler"]
        self.criterion = torch.nn.CrossEntropyLoss()
        self.log_dir = tempfile.TemporaryDirectory()

    def info_nce_loss(self, features):
        labels = torch.cat([torch.arange(self.args.batch_size) for i in range(self.args.n_views)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()

        features = F.normalize(features, dim=1)

        similarity_matrix = torch.matmul(features, features.T)

        # discard the main diagonal from both: labels and similarities matrix
        mask = torch.eye(labels.shape[0], dtype=torch.bool)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)

        # select and combine multiple positives
        positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)

        # select only the negatives
        negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)

        logits = torch.cat([positives, negatives], dim=1)
        labels = torch.zeros(logits.shape[0], dtype=torch.long)

        logits = logits / self.args.temperature
        return logits, labels

    def train(self, train_loader):
        scaler = torch.amp.GradScaler("cpu", enabled=self.args.fp16_precision)
        n_iter = 0
        epoch_counter = 0
        print(f"Start SimCLR training for {self.args.steps} steps.")

        while n_iter < self.args.steps:
            for images, _ in train_loader:
                if n_iter >= self.args.steps:
                    break
                images = torch.cat(images, dim=0)

                with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=self.args.fp16_precision):
                    features = self.model(images)
                    logits, labels = self.info_nce_loss(features)
                    loss = self.criterion(logits, labels)

                self.optimizer.zero_grad()

                scaler.scale(loss).backward()

                scaler.step(self.optimizer)
                scaler.update()

                if n_iter % self.args.log_every_n_steps == 0:
                    top1, top5 = accuracy(logits, labels, topk=(1, 5))
                    print(f"step {n_iter} loss {loss.item():.4f} acc/top1 {top1[0].item():.2f} "
                          f"acc/top5 {top5[0].item():.2f} learning_rate {self.scheduler.get_last_lr()[0]:.2e}")

                n_iter += 1

            # warmup for the first epochs
            if epoch_counter >= self.args.warmup_epochs:
                self.scheduler.step()
            print(f"Epoch: {epoch_counter}\tLoss: {loss.item()}\tTop1 accuracy: {top1[0].item()}")
            epoch_counter += 1

        print("Training has finished.")
        checkpoint_name = "checkpoint_{:04d}.pth.tar".format(epoch_counter)
        save_checkpoint({
            "epoch": epoch_counter,
            "arch": self.args.arch,
            "state_dict": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }, filename=os.path.join(self.log_dir.name, checkpoint_name))
        print(f"Model checkpoint and metadata has been saved at {self.log_dir.name}.")
        self.log_dir.cleanup()


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


def main():
    parser = argparse.ArgumentParser(description="SimCLR on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", default="convnet")
    parser.add_argument("-b", "--batch-size", default=16, type=int)
    parser.add_argument("--epoch-steps", type=int, default=3, help="batches per epoch")
    parser.add_argument("--lr", "--learning-rate", default=0.0003, type=float, dest="lr")
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--fp16-precision", action="store_true", help="bf16 autocast and a GradScaler")
    parser.add_argument("--out_dim", default=32, type=int, help="feature dimension")
    parser.add_argument("--log-every-n-steps", default=2, type=int)
    parser.add_argument("--temperature", default=0.07, type=float)
    parser.add_argument("--n-views", default=2, type=int)
    parser.add_argument("--warmup-epochs", default=1, type=int)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    size = 16
    view_generator = ContrastiveLearningViewGenerator(
        simclr_transform(size, torch.Generator().manual_seed(args.seed)), args.n_views)
    train_dataset = SyntheticImages(args.batch_size * args.epoch_steps, size, args.seed, view_generator)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)

    model = ResNetSimCLR(base_model=args.arch, out_dim=args.out_dim)
    optimizer = torch.optim.Adam(model.parameters(), args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader), eta_min=0, last_epoch=-1)

    simclr = SimCLR(model=model, optimizer=optimizer, scheduler=scheduler, args=args)
    simclr.train(train_loader)


if __name__ == "__main__":
    main()
