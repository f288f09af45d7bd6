"""Fast neural style transfer: an image transformation network trained against a frozen feature network.

Modelled on: pytorch/examples fast_neural_style
(https://github.com/pytorch/examples/tree/main/fast_neural_style/neural_style, neural_style.py,
transformer_net.py, vgg.py, utils.py)
Habits reproduced: a ``TransformerNet`` of reflection-padded convolutions, InstanceNorm2d with
``affine=True``, residual blocks and nearest-upsample convolutions; a frozen loss network with
``requires_grad = False`` on every parameter returning a namedtuple of intermediate
activations; style Gram matrices computed once before training; content + weighted style MSE
losses; ``agg_content_loss += content_loss.item()`` logging every ``log_interval``; and a
checkpoint every ``checkpoint_interval`` batches that does ``transformer.eval().cpu()``, saves the
state dict and puts the network back with ``.to(device).train()``. The loss network is randomly
initialised here (the original loads pretrained VGG16 weights).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import namedtuple

import numpy as np
import torch
from torch.optim import Adam
from torch.utils.data import DataLoader, TensorDataset


class ConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride):
        super(ConvLayer, self).__init__()
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        out = self.reflection_pad(x)
        out = self.conv2d(out)
        return out


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels):
        super(ResidualBlock, self).__init__()
        self.conv1 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, kernel_size=3, stride=1)
        self.in2 = torch.nn.InstanceNorm2d(channels, affine=True)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        residual = x
        out = self.relu(self.in1(self.conv1(x)))
        out = self.in2(self.conv2(out))
        out = out + residual
        return out


class UpsampleConvLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, upsample=None):
        super(UpsampleConvLayer, self).__init__()
        self.upsample = upsample
        reflection_padding = kernel_size // 2
        self.reflection_pad = torch.nn.ReflectionPad2d(reflection_padding)
        self.conv2d = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x):
        x_in = x
        if self.upsample:
            x_in = torch.nn.functional.interpolate(x_in, mode="nearest", scale_factor=self.upsample)
        out = self.reflection_pad(x_in)
        out = self.conv2d(out)
        return out


class TransformerNet(torch.nn.Module):
    def __init__(self):
        super(TransformerNet, self).__init__()
        # Initial convolution layers
        self.conv1 = ConvLayer(3, 8, kernel_size=5, stride=1)
        self.in1 = torch.nn.InstanceNorm2d(8, affine=True)
        self.conv2 = ConvLayer(8, 16, kernel_size=3, stride=2)
        self.in2 = torch.nn.InstanceNorm2d(16, affine=True)
        # Residual layers
        self.res1 = ResidualBlock(16)
        self.res2 = ResidualBlock(16)
        # Upsampling Layers
        self.deconv1 = UpsampleConvLayer(16, 8, kernel_size=3, stride=1, upsample=2)
        self.in3 = torch.nn.InstanceNorm2d(8, affine=True)
        self.deconv2 = ConvLayer(8, 3, kernel_size=5, stride=1)
        # Non-linearities
        self.relu = torch.nn.ReLU()

    def forward(self, X):
        y = self.relu(self.in1(self.conv1(X)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.res1(y)
        y = self.res2(y)
        y = self.relu(self.in3(self.deconv1(y)))
        y = self.deconv2(y)
        return y


class LossNetwork(torch.nn.Module):
    """A VGG-shaped feature extractor cut into slices whose outputs feed the losses."""

    def __init__(self, requires_grad=False):
        super(LossNetwork, self).__init__()
        self.slice1 = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(inplace=True))
        self.slice2 = torch.nn.Sequential(
            torch.nn.MaxPool2d(2, 2), torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(inplace=True))
        self.slice3 = torch.nn.Sequential(
            torch.nn.MaxPool2d(2, 2), torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(inplace=True))
        if not requires_grad:
            for param in self.parameters():
                param.requires_grad = False

    def forward(self, X):
        h = self.slice1(X)
        h_relu1_2 = h
        h = self.slice2(h)
        h_relu2_2 = h
        h = self.slice3(h)
        h_relu3_3 = h
        vgg_outputs = namedtuple("VggOutputs", ["relu1_2", "relu2_2", "relu3_3"])
        out = vgg_outputs(h_relu1_2, h_relu2_2, h_relu3_3)
        return out


def gram_matrix(y):
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram


def normalize_batch(batch):
    # normalize using imagenet mean and std
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    batch = batch.div_(255.0)
    return (batch - mean) / std


def train(args):
    device = torch.device("cpu")
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    generator = torch.Generator().manual_seed(args.seed)
    content = torch.rand(args.batch_size * args.epoch_steps, 3, args.image_size, args.image_size,
                         generator=generator) * 255
    train_loader = DataLoader(TensorDataset(content, torch.zeros(len(content))), batch_size=args.batch_size)

    transformer = TransformerNet().to(device)
    optimizer = Adam(transformer.parameters(), args.lr)
    mse_loss = torch.nn.MSELoss()

    vgg = LossNetwork(requires_grad=False).to(device)
    stripes = torch.arange(args.image_size).float().view(1, 1, -1).expand(3, args.image_size, -1)
    style = ((torch.sin(stripes / 2 + torch.rand(3, 1, 1, generator=generator) * 6) + 1) * 127.5)
    style = style.repeat(args.batch_size, 1, 1, 1).to(device)

    features_style = vgg(normalize_batch(style))
    gram_style = [gram_matrix(y) for y in features_style]

    save_model_dir = tempfile.TemporaryDirectory()
    batches_done = 0
    e = 0
    while batches_done < args.steps:
        transformer.train()
        agg_content_loss = 0.0
        agg_style_loss = 0.0
        count = 0
        for batch_id, (x, _) in enumerate(train_loader):
            if batches_done >= args.steps:
                break
            n_batch = len(x)
            count += n_batch
            optimizer.zero_grad()

            x = x.to(device)
            y = transformer(x)

            y = normalize_batch(y)
            x = normalize_batch(x)

            features_y = vgg(y)
            features_x = vgg(x)

            content_loss = args.content_weight * mse_loss(features_y.relu2_2, features_x.relu2_2)

            style_loss = 0.0
            for ft_y, gm_s in zip(features_y, gram_style):
                gm_y = gram_matrix(ft_y)
                style_loss += mse_loss(gm_y, gm_s[:n_batch, :, :])
            style_loss *= args.style_weight

            total_loss = content_loss + style_loss
            total_loss.backward()
            optimizer.step()
            batches_done += 1

            agg_content_loss += content_loss.item()
            agg_style_loss += style_loss.item()

            if (batch_id + 1) % args.log_interval == 0:
                mesg = "{}\tEpoch {}:\t[{}/{}]\tcontent: {:.6f}\tstyle: {:.6f}\ttotal: {:.6f}".format(
                    time.ctime(), e + 1, count, len(train_loader.dataset),
                    agg_content_loss / (batch_id + 1), agg_style_loss / (batch_id + 1),
                    (agg_content_loss + agg_style_loss) / (batch_id + 1))
                print(mesg)

            if args.checkpoint_interval is not None and batches_done % args.checkpoint_interval == 0:
                transformer.eval().cpu()
                ckpt_model_filename = "ckpt_epoch_" + str(e) + "_batch_id_" + str(batch_id + 1) + ".pth"
                ckpt_model_path = os.path.join(save_model_dir.name, ckpt_model_filename)
                torch.save(transformer.state_dict(), ckpt_model_path)
                transformer.to(device).train()
        e += 1

    # save model
    transformer.eval().cpu()
    save_model_filename = "epoch_" + str(e) + "_" + str(time.ctime()).replace(" ", "_").replace(":", "") + ".model"
    save_model_path = os.path.join(save_model_dir.name, save_model_filename)
    torch.save(transformer.state_dict(), save_model_path)
    print("\nDone, trained model saved at", save_model_path)
    save_model_dir.cleanup()


def main():
    parser = argparse.ArgumentParser(description="fast neural style training on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epoch-steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--content-weight", type=float, default=1e5)
    parser.add_argument("--style-weight", type=float, default=1e10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log-interval", type=int, default=2)
    parser.add_argument("--checkpoint-interval", type=int, default=5)
    args = parser.parse_args()
    train(args)


if __name__ == "__main__":
    main()
