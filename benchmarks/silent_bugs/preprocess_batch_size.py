"""A preprocessing step silently changing the batch size (Transformers issue 34204: the
Pixtral processor turned a batch of 50 images into a batch of 1).

A self-supervised denoising autoencoder receives its batches through a ``Preprocessor``
module (normalise, pad). From the onset a new data source tags its batches as
"multi-image samples", and the buggy branch for that case treats the whole batch as one
sample and keeps only its first image — the model trains on batches of one, with a loss
that still looks fine because the target is the processed input itself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Preprocessor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.multi_image_samples = False
        self.collapse_multi_image_bug = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.multi_image_samples and self.collapse_multi_image_bug:
            images = images[:1]
        images = (images - images.mean(dim=(1, 2, 3), keepdim=True)) / (images.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return F.pad(images, (1, 1, 1, 1))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    preprocess = Preprocessor()
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    model.train()
    for step in range(args.steps):
        raw = torch.rand(16, 1, 8, 8, generator=generator)
        preprocess.multi_image_samples = step >= args.onset  # the new data source
        preprocess.collapse_multi_image_bug = bug_active(args, step)
        batch = preprocess(raw)
        noisy = batch + 0.3 * torch.randn(batch.shape, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(noisy), batch)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} batch {batch.shape[0]}", flush=True)


if __name__ == "__main__":
    main()
