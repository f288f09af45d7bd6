"""Single-image super-resolution with a sub-pixel convolution network on synthetic Y-channel images.

Modelled on: pytorch/examples super_resolution
(https://github.com/pytorch/examples/tree/main/super_resolution, main.py and model.py)
Habits reproduced: the ESPCN-style ``Net`` (four convolutions, ``nn.PixelShuffle``) with
``init.orthogonal_`` weights scaled by ``init.calculate_gain('relu')``, low-resolution inputs
made by downsampling the targets, Adam + MSELoss, ``epoch_loss += loss.item()``, a ``test()``
every epoch reporting average PSNR ``10 * log10(1 / mse)`` under ``torch.no_grad()``, and a
``checkpoint()`` that pickles the whole model with ``torch.save(model, path)``. Gradients are
zeroed with ``optimizer.zero_grad(set_to_none=False)``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from math import log10

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super(Net, self).__init__()

        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 32, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(32, 32, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(32, 16, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(16, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

        self._initialize_weights()

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        x = self.pixel_shuffle(self.conv4(x))
        return x

    def _initialize_weights(self):
        init.orthogonal_(self.conv1.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv2.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv3.weight, init.calculate_gain("relu"))
        init.orthogonal_(self.conv4.weight)


class SyntheticLuminance(Dataset):
    """Smooth random luminance images in [0, 1]; inputs are the bicubic-downsampled targets."""

    def __init__(self, n, crop_size, upscale_factor, seed):
        generator = torch.Generator().manual_seed(seed)
        coarse = torch.rand(n, 1, crop_size // 4, crop_size // 4, generator=generator)
        self.targets = F.interpolate(coarse, size=(crop_size, crop_size), mode="bilinear", align_corners=False)
        self.inputs = F.interpolate(self.targets, scale_factor=1 / upscale_factor, mode="bicubic",
                                    align_corners=False).clamp(0, 1)

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]

    def __len__(self):
        return len(self.targets)


def main():
    parser = argparse.ArgumentParser(description="Super-resolution example on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=123, help="random seed to use")
    parser.add_argument("--upscale_factor", type=int, default=2, help="super resolution upscale factor")
    parser.add_argument("--batchSize", type=int, default=8, help="training batch size")
    parser.add_argument("--testBatchSize", type=int, default=8, help="testing batch size")
    parser.add_argument("--epochSteps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--lr", type=float, default=0.01, help="Learning Rate")
    opt = parser.parse_args()
    print(opt)

    torch.manual_seed(opt.seed)
    device = torch.device("cpu")

    print("===> Loading datasets")
    crop_size = 16
    train_set = SyntheticLuminance(opt.batchSize * opt.epochSteps, crop_size, opt.upscale_factor, opt.seed)
    test_set = SyntheticLuminance(opt.testBatchSize * 2, crop_size, opt.upscale_factor, opt.seed + 1)
    training_data_loader = DataLoader(dataset=train_set, batch_size=opt.batchSize, shuffle=True)
    testing_data_loader = DataLoader(dataset=test_set, batch_size=opt.testBatchSize, shuffle=False)

    print("===> Building model")
    model = Net(upscale_factor=opt.upscale_factor).to(device)
    criterion = nn.MSELoss()

    optimizer = optim.Adam(model.parameters(), lr=opt.lr)
    out_dir = tempfile.TemporaryDirectory()
    iterations = 0

    def train(epoch):
        nonlocal iterations
        epoch_loss = 0
        done = 0
        for iteration, batch in enumerate(training_data_loader, 1):
            if iterations >= opt.steps:
                break
            input, target = batch[0].to(device), batch[1].to(device)

            optimizer.zero_grad(set_to_none=False)
            loss = criterion(model(input), target)
            epoch_loss += loss.item()
            loss.backward()
            optimizer.step()
            iterations += 1
            done += 1

            print("===> Epoch[{}]({}/{}): Loss: {:.4f}".format(epoch, iteration, len(training_data_loader), loss.item()))

        print("===> Epoch {} Complete: Avg. Loss: {:.4f}".format(epoch, epoch_loss / max(done, 1)))

    def test():
        avg_psnr = 0
        with torch.no_grad():
            for batch in testing_data_loader:
                input, target = batch[0].to(device), batch[1].to(device)

                prediction = model(input)
                mse = criterion(prediction, target)
                psnr = 10 * log10(1 / mse.item())
                avg_psnr += psnr
        print("===> Avg. PSNR: {:.4f} dB".format(avg_psnr / len(testing_data_loader)))

    def checkpoint(epoch):
        model_out_path = os.path.join(out_dir.name, "model_epoch_{}.pth".format(epoch))
        torch.save(model, model_out_path)
        print("Checkpoint saved to {}".format(model_out_path))

    epoch = 1
    while iterations < opt.steps:
        train(epoch)
        test()
        checkpoint(epoch)
        epoch += 1
    out_dir.cleanup()


if __name__ == "__main__":
    main()
