"""Segmentation with a random-shift augmentation that draws the offset separately for image and mask (Lightning).

Bug class: data pipeline (augmentation applied to image and target with
different random parameters, so the targets no longer match the inputs).

Modelled on: mdbloice/Augmentor#209 "RandomZoom producing different
augmentations on same batch of image arguments": after a refactor the random
shifts were drawn inside the per-image ``do()`` function, so an image and its
ground-truth mask got different shifts and no longer lined up (see also
mdbloice/Augmentor#188, misaligned image/mask after random distortion).  The
training program is a small U-Net-style segmenter in a LightningModule with
batch-level augmentation switched on after two clean warm-up epochs.

What goes wrong: ``random_shift`` draws its crop offset inside the helper that
is called once for the images and once for the masks.  From the first
augmented epoch on, each mask is translated by a different (random) offset than
its image, so up to a few pixels of every object border are labelled wrongly.
The Dice/BCE loss still falls, just to a worse value, and nothing crashes.

Healthy twin: the offsets are drawn once per sample and applied to both image
and mask.

Onset: 96 samples / batch 8 = 12 optimizer steps per epoch; augmentation starts
at epoch 2, whose first batch is optimizer step K = 24 (of 60).
"""
import sys
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

SIZE = 32
PAD = 4
AUG_FROM_EPOCH = 2
N_TRAIN = 96


def make_shapes(n, gen):
    """Noisy images with one bright disc or box each; the mask marks the object."""
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    images, masks = [], []
    for _ in range(n):
        cy, cx = (torch.rand(2, generator=gen) * (SIZE - 12) + 6).tolist()
        r = float(torch.rand(1, generator=gen) * 5 + 4)
        if torch.rand(1, generator=gen) < 0.5:
            m = ((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r).float()
        else:
            m = (((yy - cy).abs() <= r) & ((xx - cx).abs() <= r * 0.7)).float()
        img = 0.3 + 0.6 * m + 0.15 * torch.randn(SIZE, SIZE, generator=gen)
        images.append(img[None])
        masks.append(m[None])
    return torch.stack(images), torch.stack(masks)


def _crop(t, oy, ox):
    padded = F.pad(t, (PAD, PAD, PAD, PAD), mode="replicate")
    return padded[:, oy:oy + SIZE, ox:ox + SIZE]


def random_shift(t):
    """Pad-and-crop translation of one sample (offset drawn here)."""
    oy, ox = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
    return _crop(t, oy, ox)


def augment_pair(img, mask):
    if HEALTHY:
        oy, ox = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
        return _crop(img, oy, ox), _crop(mask, oy, ox)
    return random_shift(img), random_shift(mask)  # BUG: independent offsets


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class TinyUNet(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.enc1 = Block(1, 8)
        self.enc2 = Block(8, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = Block(16, 8)
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        return self.out(self.dec(torch.cat([self.up(e2), e1], dim=1)))

    def on_after_batch_transfer(self, batch, dataloader_idx):
        images, masks = batch
        if self.trainer.training and self.current_epoch >= AUG_FROM_EPOCH:
            pairs = [augment_pair(i, m) for i, m in zip(images, masks)]
            images = torch.stack([p[0] for p in pairs])
            masks = torch.stack([p[1] for p in pairs])
        return images, masks

    def training_step(self, batch, batch_idx):
        if not HEALTHY and self.current_epoch == AUG_FROM_EPOCH and batch_idx == 0:
            print(f"ONSET step {self.global_step}")
        images, masks = batch
        logits = self(images)
        prob = torch.sigmoid(logits)
        dice = 1 - (2 * (prob * masks).sum() + 1) / (prob.sum() + masks.sum() + 1)
        loss = F.binary_cross_entropy_with_logits(logits, masks) + dice
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, masks = batch
        pred = (self(images) > 0).float()
        inter = (pred * masks).sum()
        iou = inter / (pred.sum() + masks.sum() - inter + 1e-6)
        self.log("val_iou", iou)

    def on_validation_epoch_end(self):
        print(f"epoch {self.current_epoch} val_iou {self.trainer.callback_metrics['val_iou']:.3f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def main():
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(5)
    x_train, y_train = make_shapes(N_TRAIN, gen)
    x_val, y_val = make_shapes(32, gen)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=8,
                                        shuffle=True, num_workers=0)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_val, y_val), batch_size=16, num_workers=0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=5, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp)
        trainer.fit(TinyUNet(), train, val)
    print("done")


if __name__ == "__main__":
    main()
