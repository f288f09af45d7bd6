"""Modelled on ritheshkumar95/pytorch-vqvae (functions.py, modules.py, vqvae.py), a PyTorch
port of "Neural Discrete Representation Learning" (van den Oord et al. 2017).

Exercises custom torch.autograd.Function classes: a non-differentiable nearest-codeword
lookup (forward under no_grad, mark_non_differentiable, backward raises) and a
straight-through quantiser whose backward copies the decoder's gradient to the encoder output
and (optionally) scatters it into a codebook gradient with index_add_. The codebook is passed
*detached* to the straight-through op and learns only through the separate VQ loss on an
index_select of the live embedding; the commitment loss uses the detached codes. Synthetic
1x16x16 "sprite" images.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Function

torch.set_num_threads(1)
torch.manual_seed(0)


class VectorQuantization(Function):
    @staticmethod
    def forward(ctx, inputs, codebook):
        with torch.no_grad():
            embedding_size = codebook.size(1)
            inputs_size = inputs.size()
            inputs_flatten = inputs.view(-1, embedding_size)
            codebook_sqr = torch.sum(codebook ** 2, dim=1)
            inputs_sqr = torch.sum(inputs_flatten ** 2, dim=1, keepdim=True)
            distances = torch.addmm(codebook_sqr + inputs_sqr, inputs_flatten, codebook.t(), alpha=-2.0, beta=1.0)
            _, indices_flatten = torch.min(distances, dim=1)
            indices = indices_flatten.view(*inputs_size[:-1])
            ctx.mark_non_differentiable(indices)
            return indices

    @staticmethod
    def backward(ctx, grad_output):
        raise RuntimeError("Trying to call `.grad()` on graph containing `VectorQuantization`. "
                           "The function `VectorQuantization` is not differentiable. "
                           "Use `VectorQuantizationStraightThrough` if you want a straight-through estimator.")


class VectorQuantizationStraightThrough(Function):
    @staticmethod
    def forward(ctx, inputs, codebook):
        indices = vq(inputs, codebook)
        indices_flatten = indices.view(-1)
        ctx.save_for_backward(indices_flatten, codebook)
        ctx.mark_non_differentiable(indices_flatten)
        codes_flatten = torch.index_select(codebook, dim=0, index=indices_flatten)
        codes = codes_flatten.view_as(inputs)
        return (codes, indices_flatten)

    @staticmethod
    def backward(ctx, grad_output, grad_indices):
        grad_inputs, grad_codebook = None, None
        if ctx.needs_input_grad[0]:
            # Straight-through estimator
            grad_inputs = grad_output.clone()
        if ctx.needs_input_grad[1]:
            # Gradient wrt. the codebook
            indices, codebook = ctx.saved_tensors
            embedding_size = codebook.size(1)
            grad_output_flatten = grad_output.contiguous().view(-1, embedding_size)
            grad_codebook = torch.zeros_like(codebook)
            grad_codebook.index_add_(0, indices, grad_output_flatten)
        return (grad_inputs, grad_codebook)


vq = VectorQuantization.apply
vq_st = VectorQuantizationStraightThrough.apply


class VQEmbedding(nn.Module):
    def __init__(self, K, D):
        super().__init__()
        self.embedding = nn.Embedding(K, D)
        self.embedding.weight.data.uniform_(-1. / K, 1. / K)

    def forward(self, z_e_x):
        z_e_x_ = z_e_x.permute(0, 2, 3, 1).contiguous()
        return vq(z_e_x_, self.embedding.weight)

    def straight_through(self, z_e_x):
        z_e_x_ = z_e_x.permute(0, 2, 3, 1).contiguous()
        z_q_x_, indices = vq_st(z_e_x_, self.embedding.weight.detach())
        z_q_x = z_q_x_.permute(0, 3, 1, 2).contiguous()
        z_q_x_bar_flatten = torch.index_select(self.embedding.weight, dim=0, index=indices)
        z_q_x_bar_ = z_q_x_bar_flatten.view_as(z_e_x_)
        z_q_x_bar = z_q_x_bar_.permute(0, 3, 1, 2).contiguous()
        return z_q_x, z_q_x_bar


class ResBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(True), nn.Conv2d(dim, dim, 3, 1, 1), nn.BatchNorm2d(dim),
                                   nn.ReLU(True), nn.Conv2d(dim, dim, 1), nn.BatchNorm2d(dim))

    def forward(self, x):
        return x + self.block(x)


class VectorQuantizedVAE(nn.Module):
    def __init__(self, input_dim, dim, K=32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(input_dim, dim, 4, 2, 1), nn.BatchNorm2d(dim), nn.ReLU(True),
                                     nn.Conv2d(dim, dim, 4, 2, 1), ResBlock(dim))
        self.codebook = VQEmbedding(K, dim)
        self.decoder = nn.Sequential(ResBlock(dim), nn.ReLU(True), nn.ConvTranspose2d(dim, dim, 4, 2, 1),
                                     nn.BatchNorm2d(dim), nn.ReLU(True), nn.ConvTranspose2d(dim, input_dim, 4, 2, 1),
                                     nn.Tanh())

    def encode(self, x):
        return self.codebook(self.encoder(x))

    def forward(self, x):
        z_e_x = self.encoder(x)
        z_q_x_st, z_q_x = self.codebook.straight_through(z_e_x)
        x_tilde = self.decoder(z_q_x_st)
        return x_tilde, z_e_x, z_q_x


def sprites(n):
    imgs = -torch.ones(n, 1, 16, 16)
    for i in range(n):
        r, c = torch.randint(0, 10, (2,)).tolist()
        s = int(torch.randint(3, 7, (1,)))
        imgs[i, 0, r:r + s, c:c + s] = 1.0
    return imgs


beta = 1.0
model = VectorQuantizedVAE(1, 32, K=32)
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
train_images, test_images = sprites(1024), sprites(128)
loader = torch.utils.data.DataLoader(train_images, batch_size=32, shuffle=True)

steps = 0
for epoch in range(2):
    for images in loader:
        x_tilde, z_e_x, z_q_x = model(images)
        loss_recons = F.mse_loss(x_tilde, images)
        loss_vq = F.mse_loss(z_q_x, z_e_x.detach())           # moves the codebook toward encoder outputs
        loss_commit = F.mse_loss(z_e_x, z_q_x.detach())       # commitment loss
        loss = loss_recons + loss_vq + beta * loss_commit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if steps % 10 == 0:
            print(f"step {steps} recons {loss_recons.item():.4f} vq {loss_vq.item():.4f}")
        if steps == 50:
            break

model.eval()
with torch.no_grad():
    x_tilde, z_e_x, z_q_x = model(test_images)
    codes = model.encode(test_images)
print("test recons", F.mse_loss(x_tilde, test_images).item(), "codes used", codes.unique().numel())
