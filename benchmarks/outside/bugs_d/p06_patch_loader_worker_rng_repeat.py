"""P06 (class: data-loader seeding mistake -- every epoch replays the same random patches) -- plain loop.

Modelled on Project-MONAI/MONAI#1068 "Random transforms generates the same random
repeatly": MONAI's Randomizable transforms keep their own `self.R = np.random.RandomState`;
that object is copied into each DataLoader worker process, and since the workers are
re-created (forked from an unchanged parent) every epoch and nothing re-seeds `R`, the
random numbers "repeat every epoch".  (The fix is MONAI's DataLoader `worker_init_fn`
that re-seeds the transforms from the per-worker torch seed; background: pytorch/pytorch#5059
"np.random generates the same random numbers for each data batch".  PyTorch >= 1.9 re-seeds
the *global* NumPy RNG in workers, but not RandomState/Generator objects held by a dataset.)

Patch-based training of a small 2-D segmentation net: each sample is a random patch
(random volume, random location, random flip, random intensity jitter) drawn with the
dataset's own RandomState, as MONAI's RandCropByPosNegLabel/RandSpatialCrop do.  One
loader worker, workers not persistent.  Epoch 0 (steps 0-11) is a normal random stream;
from epoch 1 (optimizer step 12) on, each epoch replays exactly the same patches in the
same order, so the model keeps re-fitting the same 12 batches.
Healthy twin: a `worker_init_fn` re-seeds the dataset's RandomState from the worker seed.
"""
import sys, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader, get_worker_info

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)

EPOCHS, STEPS_PER_EPOCH, BATCH, PATCH = 3, 12, 16, 20


def make_volumes(n=6, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    imgs, labs = [], []
    for _ in range(n):
        lab = torch.zeros(size, size)
        for _ in range(10):
            cy, cx = (torch.rand(2, generator=g) * size).tolist()
            r = 2 + 6 * torch.rand(1, generator=g).item()
            lab = torch.maximum(lab, (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r).float())
        img = lab * (0.6 + 0.4 * torch.rand(1, generator=g)) + 0.4 * torch.randn(size, size, generator=g)
        imgs.append(img.numpy())
        labs.append(lab.numpy())
    return np.stack(imgs), np.stack(labs)


class RandPatchDataset(Dataset):
    """Samples random training patches; randomness from its own RandomState (MONAI style)."""

    def __init__(self, images, labels, samples_per_epoch, patch, seed=0):
        self.images, self.labels = images, labels
        self.samples_per_epoch, self.patch = samples_per_epoch, patch
        self.R = np.random.RandomState(seed)

    def set_random_state(self, seed):
        self.R = np.random.RandomState(seed)

    def __len__(self):
        return self.samples_per_epoch

    def __getitem__(self, index):            # index is irrelevant: patches are sampled
        v = self.R.randint(len(self.images))
        y0, x0 = self.R.randint(0, self.images.shape[1] - self.patch, size=2)
        img = self.images[v, y0:y0 + self.patch, x0:x0 + self.patch]
        lab = self.labels[v, y0:y0 + self.patch, x0:x0 + self.patch]
        if self.R.rand() < 0.5:
            img, lab = img[:, ::-1], lab[:, ::-1]
        img = img * self.R.uniform(0.8, 1.2) + self.R.uniform(-0.1, 0.1)
        return (torch.from_numpy(np.ascontiguousarray(img)).float().unsqueeze(0),
                torch.from_numpy(np.ascontiguousarray(lab)).float().unsqueeze(0))


def worker_init_fn(worker_id):
    info = get_worker_info()
    info.dataset.set_random_state(info.seed % (2 ** 32))


class Net(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1), nn.InstanceNorm2d(c), nn.PReLU(),
            nn.Conv2d(c, c, 3, padding=2, dilation=2), nn.InstanceNorm2d(c), nn.PReLU(),
            nn.Conv2d(c, c, 3, padding=4, dilation=4), nn.InstanceNorm2d(c), nn.PReLU(),
            nn.Conv2d(c, 1, 1))

    def forward(self, x):
        return self.body(x)


def dice_ce(logits, y):
    p = torch.sigmoid(logits)
    dice = 1 - (2 * (p * y).sum() + 1) / (p.sum() + y.sum() + 1)
    return dice + F.binary_cross_entropy_with_logits(logits, y)


def main():
    images, labels = make_volumes(seed=0)
    val_images, val_labels = make_volumes(n=2, seed=1)
    train_ds = RandPatchDataset(images, labels, STEPS_PER_EPOCH * BATCH, PATCH, seed=12345)
    train_loader = DataLoader(train_ds, batch_size=BATCH, shuffle=True, num_workers=1,
                              persistent_workers=False,
                              worker_init_fn=worker_init_fn if HEALTHY else None,
                              generator=torch.Generator().manual_seed(0))
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=2e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * STEPS_PER_EPOCH)
    vx = torch.from_numpy(val_images).float().unsqueeze(1)
    vy = torch.from_numpy(val_labels).float().unsqueeze(1)

    t0 = time.time()
    step = 0
    for epoch in range(EPOCHS):
        net.train()
        if not HEALTHY and epoch == 1:
            print("ONSET step", step)
        for x, y in train_loader:
            opt.zero_grad()
            loss = dice_ce(net(x), y)
            loss.backward()
            opt.step()
            sched.step()
            if step % 4 == 0:
                print(f"epoch {epoch} step {step:2d} loss {loss.item():.4f}")
            step += 1
        net.eval()
        with torch.no_grad():
            logits = net(vx)
            val_loss = dice_ce(logits, vy).item()
            pred = (logits > 0).float()
            dice = (2 * (pred * vy).sum() / (pred.sum() + vy.sum())).item()
        print(f"== epoch {epoch}: val loss {val_loss:.4f} val dice {dice:.4f}")
    print(f"done: {step} steps in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
