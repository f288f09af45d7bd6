"""Paired image-to-image translation (pix2pix) on synthetic 16x16 edge/fill image pairs.

Modelled on: junyanz/pytorch-CycleGAN-and-pix2pix, the pix2pix model
(https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix, train.py, models/pix2pix_model.py,
models/networks.py, models/base_model.py)
Habits reproduced: a model object with ``set_input``/``forward``/``optimize_parameters``, a
recursive ``UnetSkipConnectionBlock`` generator with Dropout and a PatchGAN
``NLayerDiscriminator``, ``init_weights`` applied through ``net.apply(init_func)`` with
``init.normal_`` on conv weights and BatchNorm weights around 1.0, a ``GANLoss`` that keeps its
real/fake labels as registered buffers and expands them to the prediction, ``set_requires_grad``
switching the discriminator off during the generator update, the fake pair ``detach()``-ed for the
discriminator, L1 reconstruction weighted by ``lambda_L1``, Adam with beta1 0.5, linear-decay
``LambdaLR`` schedulers stepped by ``update_learning_rate()`` at the start of every epoch,
``get_current_losses`` via ``float(getattr(self, 'loss_' + name))`` printed every
``print_freq`` iterations and ``save_networks`` of state dicts at every epoch end.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from collections import OrderedDict

import torch
import torch.nn as nn
from torch.nn import init
from torch.optim import lr_scheduler


def init_weights(net, init_type="normal", init_gain=0.02):
    def init_func(m):
        classname = m.__class__.__name__
        if hasattr(m, "weight") and (classname.find("Conv") != -1 or classname.find("Linear") != -1):
            if init_type == "normal":
                init.normal_(m.weight.data, 0.0, init_gain)
            elif init_type == "xavier":
                init.xavier_normal_(m.weight.data, gain=init_gain)
            if hasattr(m, "bias") and m.bias is not None:
                init.constant_(m.bias.data, 0.0)
        elif classname.find("BatchNorm2d") != -1:
            init.normal_(m.weight.data, 1.0, init_gain)
            init.constant_(m.bias.data, 0.0)

    print("initialize network with %s" % init_type)
    net.apply(init_func)


class UnetSkipConnectionBlock(nn.Module):
    def __init__(self, outer_nc, inner_nc, input_nc=None, submodule=None, outermost=False, innermost=False,
                 norm_layer=nn.BatchNorm2d, use_dropout=False):
        super(UnetSkipConnectionBlock, self).__init__()
        self.outermost = outermost
        use_bias = norm_layer.func == nn.InstanceNorm2d if isinstance(norm_layer, functools.partial) \
            else norm_layer == nn.InstanceNorm2d
        if input_nc is None:
            input_nc = outer_nc
        downconv = nn.Conv2d(input_nc, inner_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
        downrelu = nn.LeakyReLU(0.2, True)
        downnorm = norm_layer(inner_nc)
        uprelu = nn.ReLU(True)
        upnorm = norm_layer(outer_nc)

        if outermost:
            upconv = nn.ConvTranspose2d(inner_nc * 2, outer_nc, kernel_size=4, stride=2, padding=1)
            down = [downconv]
            up = [uprelu, upconv, nn.Tanh()]
            model = down + [submodule] + up
        elif innermost:
            upconv = nn.ConvTranspose2d(inner_nc, outer_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
            down = [downrelu, downconv]
            up = [uprelu, upconv, upnorm]
            model = down + up
        else:
            upconv = nn.ConvTranspose2d(inner_nc * 2, outer_nc, kernel_size=4, stride=2, padding=1, bias=use_bias)
            down = [downrelu, downconv, downnorm]
            up = [uprelu, upconv, upnorm]
            model = down + [submodule] + up + ([nn.Dropout(0.5)] if use_dropout else [])

        self.model = nn.Sequential(*model)

    def forward(self, x):
        if self.outermost:
            return self.model(x)
        return torch.cat([x, self.model(x)], 1)


class UnetGenerator(nn.Module):
    def __init__(self, input_nc, output_nc, num_downs, ngf=8, norm_layer=nn.BatchNorm2d, use_dropout=False):
        super(UnetGenerator, self).__init__()
        unet_block = UnetSkipConnectionBlock(ngf * 4, ngf * 4, norm_layer=norm_layer, innermost=True)
        for _ in range(num_downs - 4):
            unet_block = UnetSkipConnectionBlock(ngf * 4, ngf * 4, submodule=unet_block, norm_layer=norm_layer,
                                                 use_dropout=use_dropout)
        unet_block = UnetSkipConnectionBlock(ngf * 2, ngf * 4, submodule=unet_block, norm_layer=norm_layer)
        unet_block = UnetSkipConnectionBlock(ngf, ngf * 2, submodule=unet_block, norm_layer=norm_layer)
        self.model = UnetSkipConnectionBlock(output_nc, ngf, input_nc=input_nc, submodule=unet_block,
                                             outermost=True, norm_layer=norm_layer)

    def forward(self, input):
        return self.model(input)


class NLayerDiscriminator(nn.Module):
    """PatchGAN discriminator"""

    def __init__(self, input_nc, ndf=8, n_layers=2, norm_layer=nn.BatchNorm2d):
        super(NLayerDiscriminator, self).__init__()
        use_bias = norm_layer == nn.InstanceNorm2d
        kw = 4
        padw = 1
        sequence = [nn.Conv2d(input_nc, ndf, kernel_size=kw, stride=2, padding=padw), nn.LeakyReLU(0.2, True)]
        nf_mult = 1
        for n in range(1, n_layers):
            nf_mult_prev = nf_mult
            nf_mult = min(2 ** n, 8)
            sequence += [
                nn.Conv2d(ndf * nf_mult_prev, ndf * nf_mult, kernel_size=kw, stride=2, padding=padw, bias=use_bias),
                norm_layer(ndf * nf_mult),
                nn.LeakyReLU(0.2, True),
            ]
        nf_mult_prev = nf_mult
        nf_mult = min(2 ** n_layers, 8)
        sequence += [
            nn.Conv2d(ndf * nf_mult_prev, ndf * nf_mult, kernel_size=kw, stride=1, padding=padw, bias=use_bias),
            norm_layer(ndf * nf_mult),
            nn.LeakyReLU(0.2, True),
        ]
        sequence += [nn.Conv2d(ndf * nf_mult, 1, kernel_size=kw, stride=1, padding=padw)]
        self.model = nn.Sequential(*sequence)

    def forward(self, input):
        return self.model(input)


class GANLoss(nn.Module):
    def __init__(self, gan_mode, target_real_label=1.0, target_fake_label=0.0):
        super(GANLoss, self).__init__()
        self.register_buffer("real_label", torch.tensor(target_real_label))
        self.register_buffer("fake_label", torch.tensor(target_fake_label))
        self.gan_mode = gan_mode
        if gan_mode == "lsgan":
            self.loss = nn.MSELoss()
        elif gan_mode == "vanilla":
            self.loss = nn.BCEWithLogitsLoss()
        else:
            raise NotImplementedError("gan mode %s not implemented" % gan_mode)

    def get_target_tensor(self, prediction, target_is_real):
        target_tensor = self.real_label if target_is_real else self.fake_label
        return target_tensor.expand_as(prediction)

    def __call__(self, prediction, target_is_real):
        target_tensor = self.get_target_tensor(prediction, target_is_real)
        return self.loss(prediction, target_tensor)


class Pix2PixModel:
    def __init__(self, opt):
        self.opt = opt
        self.save_dir = opt.checkpoints_dir
        self.loss_names = ["G_GAN", "G_L1", "D_real", "D_fake"]
        self.model_names = ["G", "D"]
        self.netG = UnetGenerator(1, 1, 4, opt.ngf, use_dropout=True)
        init_weights(self.netG)
        self.netD = NLayerDiscriminator(2, opt.ndf, n_layers=2)
        init_weights(self.netD)

        self.criterionGAN = GANLoss(opt.gan_mode)
        self.criterionL1 = torch.nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizers = [self.optimizer_G, self.optimizer_D]

    def setup(self):
        def lambda_rule(epoch):
            return 1.0 - max(0, epoch + 1 - self.opt.n_epochs) / float(self.opt.n_epochs_decay + 1)

        self.schedulers = [lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda_rule) for optimizer in self.optimizers]

    def set_input(self, input):
        self.real_A = input["A"]
        self.real_B = input["B"]

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    def backward_D(self):
        # Fake; stop backprop to the generator by detaching fake_B
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        pred_fake = self.netD(fake_AB.detach())
        self.loss_D_fake = self.criterionGAN(pred_fake, False)
        # Real
        real_AB = torch.cat((self.real_A, self.real_B), 1)
        pred_real = self.netD(real_AB)
        self.loss_D_real = self.criterionGAN(pred_real, True)
        self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5
        self.loss_D.backward()

    def backward_G(self):
        fake_AB = torch.cat((self.real_A, self.fake_B), 1)
        pred_fake = self.netD(fake_AB)
        self.loss_G_GAN = self.criterionGAN(pred_fake, True)
        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_L1
        self.loss_G = self.loss_G_GAN + self.loss_G_L1
        self.loss_G.backward()

    def set_requires_grad(self, nets, requires_grad=False):
        if not isinstance(nets, list):
            nets = [nets]
        for net in nets:
            if net is not None:
                for param in net.parameters():
                    param.requires_grad = requires_grad

    def optimize_parameters(self):
        self.forward()
        # update D
        self.set_requires_grad(self.netD, True)
        self.optimizer_D.zero_grad()
        self.backward_D()
        self.optimizer_D.step()
        # update G
        self.set_requires_grad(self.netD, False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()

    def update_learning_rate(self):
        old_lr = self.optimizers[0].param_groups[0]["lr"]
        for scheduler in self.schedulers:
            scheduler.step()
        lr = self.optimizers[0].param_groups[0]["lr"]
        print("learning rate %.7f -> %.7f" % (old_lr, lr))

    def get_current_losses(self):
        errors_ret = OrderedDict()
        for name in self.loss_names:
            if isinstance(name, str):
                errors_ret[name] = float(getattr(self, "loss_" + name))
        return errors_ret

    def save_networks(self, epoch):
        for name in self.model_names:
            save_filename = "%s_net_%s.pth" % (epoch, name)
            save_path = os.path.join(self.save_dir, save_filename)
            net = getattr(self, "net" + name)
            torch.save(net.cpu().state_dict(), save_path)


class AlignedDataset(torch.utils.data.Dataset):
    """A: the outline of a rectangle; B: the filled rectangle (both in [-1, 1])."""

    def __init__(self, n, seed):
        generator = torch.Generator().manual_seed(seed)
        self.pairs = []
        for _ in range(n):
            top, left = torch.randint(1, 7, (2,), generator=generator).tolist()
            h, w = torch.randint(4, 9, (2,), generator=generator).tolist()
            filled = -torch.ones(1, 16, 16)
            filled[:, top:top + h, left:left + w] = 1.0
            outline = filled.clone()
            outline[:, top + 1:top + h - 1, left + 1:left + w - 1] = -1.0
            self.pairs.append((outline, filled))

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        A, B = self.pairs[index]
        return {"A": A, "B": B, "A_paths": "synthetic_%d" % index}


def main():
    parser = argparse.ArgumentParser(description="pix2pix on synthetic paired images")
    parser.add_argument("--steps", type=int, default=20, help="training iterations in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--epoch_iters", type=int, default=3, help="iterations per epoch")
    parser.add_argument("--ngf", type=int, default=8)
    parser.add_argument("--ndf", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--beta1", type=float, default=0.5)
    parser.add_argument("--lambda_L1", type=float, default=100.0)
    parser.add_argument("--gan_mode", type=str, default="vanilla", choices=["vanilla", "lsgan"])
    parser.add_argument("--print_freq", type=int, default=2)
    opt = parser.parse_args()

    torch.manual_seed(opt.seed)
    total_epochs = -(-opt.steps // opt.epoch_iters)
    opt.n_epochs = max(1, total_epochs // 2)
    opt.n_epochs_decay = total_epochs - opt.n_epochs

    dataset = AlignedDataset(opt.batch_size * opt.epoch_iters, opt.seed)
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batch_size, shuffle=True)
    print("The number of training images = %d" % len(dataset))

    with tempfile.TemporaryDirectory() as checkpoints_dir:
        opt.checkpoints_dir = checkpoints_dir
        model = Pix2PixModel(opt)
        model.setup()
        total_iters = 0

        for epoch in range(1, total_epochs + 1):
            if epoch > 1:
                model.update_learning_rate()
            epoch_iter = 0
            for i, data in enumerate(dataloader):
                if total_iters >= opt.steps:
                    break
                total_iters += 1
                epoch_iter += opt.batch_size
                model.set_input(data)
                model.optimize_parameters()

                if total_iters % opt.print_freq == 0:
                    losses = model.get_current_losses()
                    message = "(epoch: %d, iters: %d) " % (epoch, epoch_iter)
                    message += " ".join("%s: %.3f" % (k, v) for k, v in losses.items())
                    print(message)

            print("saving the model at the end of epoch %d, iters %d" % (epoch, total_iters))
            model.save_networks("latest")
            model.save_networks(epoch)


if __name__ == "__main__":
    main()
