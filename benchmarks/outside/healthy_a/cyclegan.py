"""Healthy: junyanz/pytorch-CycleGAN-and-pix2pix, models/cycle_gan_model.py (CycleGAN, not pix2pix): two generators
G_A, G_B and two PatchGAN discriminators D_A, D_B with InstanceNorm, init_weights normal(0, 0.02), LSGAN loss
(GANLoss('lsgan') with MSE against target tensors expanded to the prediction), cycle-consistency and identity losses,
ImagePool(50) history buffers for the fake images fed to D, set_requires_grad([D_A, D_B], False) while optimizing the
generators, itertools.chain optimizers (one Adam for both G, one for both D), LambdaLR linear decay scheduler, and a
test pass (netG.eval(), no_grad) every 10 iterations."""
import itertools, random, torch
from torch import nn
torch.manual_seed(0); random.seed(0)
def init_weights(net, init_gain=0.02):
    def init_func(m):
        classname = m.__class__.__name__
        if hasattr(m, 'weight') and (classname.find('Conv') != -1 or classname.find('Linear') != -1):
            nn.init.normal_(m.weight.data, 0.0, init_gain)
            if hasattr(m, 'bias') and m.bias is not None: nn.init.constant_(m.bias.data, 0.0)
    net.apply(init_func); return net
class ResnetBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv_block = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3), nn.InstanceNorm2d(dim), nn.ReLU(True),
                                        nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3), nn.InstanceNorm2d(dim))
    def forward(self, x): return x + self.conv_block(x)
def resnet_generator(ngf=16):
    return init_weights(nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, ngf, 7), nn.InstanceNorm2d(ngf), nn.ReLU(True),
                                      nn.Conv2d(ngf, ngf * 2, 3, 2, 1), nn.InstanceNorm2d(ngf * 2), nn.ReLU(True),
                                      ResnetBlock(ngf * 2), ResnetBlock(ngf * 2),
                                      nn.ConvTranspose2d(ngf * 2, ngf, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(ngf), nn.ReLU(True),
                                      nn.ReflectionPad2d(3), nn.Conv2d(ngf, 3, 7), nn.Tanh()))
def n_layer_discriminator(ndf=16):
    return init_weights(nn.Sequential(nn.Conv2d(3, ndf, 4, 2, 1), nn.LeakyReLU(0.2, True),
                                      nn.Conv2d(ndf, ndf * 2, 4, 2, 1), nn.InstanceNorm2d(ndf * 2), nn.LeakyReLU(0.2, True),
                                      nn.Conv2d(ndf * 2, 1, 4, 1, 1)))
class GANLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer('real_label', torch.tensor(1.0)); self.register_buffer('fake_label', torch.tensor(0.0)); self.loss = nn.MSELoss()
    def __call__(self, prediction, target_is_real):
        target = (self.real_label if target_is_real else self.fake_label).expand_as(prediction)
        return self.loss(prediction, target)
class ImagePool:
    def __init__(self, pool_size): self.pool_size, self.num_imgs, self.images = pool_size, 0, []
    def query(self, images):
        return_images = []
        for image in images:
            image = torch.unsqueeze(image.data, 0)
            if self.num_imgs < self.pool_size:
                self.num_imgs += 1; self.images.append(image); return_images.append(image)
            elif random.uniform(0, 1) > 0.5:
                random_id = random.randint(0, self.pool_size - 1); tmp = self.images[random_id].clone()
                self.images[random_id] = image; return_images.append(tmp)
            else:
                return_images.append(image)
        return torch.cat(return_images, 0)
def set_requires_grad(nets, requires_grad=False):
    for net in nets:
        for param in net.parameters(): param.requires_grad = requires_grad
netG_A, netG_B, netD_A, netD_B = resnet_generator(), resnet_generator(), n_layer_discriminator(), n_layer_discriminator()
criterionGAN, criterionCycle, criterionIdt = GANLoss(), nn.L1Loss(), nn.L1Loss()
optimizer_G = torch.optim.Adam(itertools.chain(netG_A.parameters(), netG_B.parameters()), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(itertools.chain(netD_A.parameters(), netD_B.parameters()), lr=2e-4, betas=(0.5, 0.999))
n_epochs, n_epochs_decay = 2, 2
def lambda_rule(epoch): return 1.0 - max(0, epoch - n_epochs) / float(n_epochs_decay + 1)
schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda=lambda_rule) for o in (optimizer_G, optimizer_D)]
fake_A_pool, fake_B_pool = ImagePool(50), ImagePool(50)
lambda_A = lambda_B = 10.0; lambda_idt = 0.5
def domain_A(n): g = torch.linspace(-1, 1, 16); return torch.sin(g[:, None] * (3 + torch.rand(n, 3, 1, 1) * 3)) * torch.ones(16)
def domain_B(n): return domain_A(n).transpose(-1, -2).flip(1)
def backward_D_basic(netD, real, fake):
    loss_D = (criterionGAN(netD(real), True) + criterionGAN(netD(fake.detach()), False)) * 0.5
    loss_D.backward(); return loss_D
it = 0
for epoch in range(n_epochs + n_epochs_decay):
    for _ in range(6):
        real_A, real_B = domain_A(4), domain_B(4)
        fake_B = netG_A(real_A); rec_A = netG_B(fake_B); fake_A = netG_B(real_B); rec_B = netG_A(fake_A)
        set_requires_grad([netD_A, netD_B], False)
        optimizer_G.zero_grad()
        idt_A = netG_A(real_B); loss_idt_A = criterionIdt(idt_A, real_B) * lambda_B * lambda_idt
        idt_B = netG_B(real_A); loss_idt_B = criterionIdt(idt_B, real_A) * lambda_A * lambda_idt
        loss_G = (criterionGAN(netD_A(fake_B), True) + criterionGAN(netD_B(fake_A), True)
                  + criterionCycle(rec_A, real_A) * lambda_A + criterionCycle(rec_B, real_B) * lambda_B + loss_idt_A + loss_idt_B)
        loss_G.backward(); optimizer_G.step()
        set_requires_grad([netD_A, netD_B], True)
        optimizer_D.zero_grad()
        loss_D_A = backward_D_basic(netD_A, real_B, fake_B_pool.query(fake_B))
        loss_D_B = backward_D_basic(netD_B, real_A, fake_A_pool.query(fake_A))
        optimizer_D.step()
        it += 1
        if it % 10 == 0:
            netG_A.eval()
            with torch.no_grad():
                test_A = domain_A(8); print(f"it {it} G {loss_G.item():.3f} D {loss_D_A.item():.3f}/{loss_D_B.item():.3f} test cycle {(netG_B(netG_A(test_A)) - test_A).abs().mean().item():.3f}")
            netG_A.train()
    for s in schedulers: s.step()
