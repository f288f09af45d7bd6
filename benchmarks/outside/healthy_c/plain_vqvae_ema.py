"""Modelled on zalandoresearch/pytorch-vq-vae (vq-vae.ipynb: VectorQuantizerEMA) and
rosinality/vq-vae-2-pytorch (vqvae.py Quantize with EMA codebook, train_vqvae.py).

A small conv VQ-VAE on synthetic 16x16 'shape' images.  Codebook is *not* a parameter: it is
held in buffers and updated by exponential moving averages of assigned encoder outputs
with Laplace smoothing (under torch.no_grad()), so only encoder/decoder get gradients.
The straight-through estimator is written as a custom torch.autograd.Function.  Loss =
MSE reconstruction + beta * commitment; Adam; perplexity logging; held-out evaluation
under model.eval()/no_grad; checkpoint save + reload and check of identical output."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)   # small convs on 16x16 images: single-threaded is fastest

# ------------------------------------------------------------------ data
def make_images(n, g):
    yy, xx = torch.meshgrid(torch.arange(16.), torch.arange(16.), indexing="ij")
    imgs = torch.zeros(n, 1, 16, 16)
    for i in range(n):
        cx, cy = torch.randint(4, 12, (2,), generator=g).tolist()
        r = float(torch.randint(2, 5, (1,), generator=g))
        if torch.rand(1, generator=g) < 0.5:
            m = ((xx - cx) ** 2 + (yy - cy) ** 2) <= r * r
        else:
            m = ((xx - cx).abs() <= r) & ((yy - cy).abs() <= r)
        imgs[i, 0][m] = 0.5 + 0.5 * float(torch.rand(1, generator=g))
    return imgs + 0.02 * torch.randn(imgs.shape, generator=g)

g = torch.Generator().manual_seed(1)
train_x, test_x = make_images(512, g), make_images(128, g)
data_variance = train_x.var().item()
train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x), batch_size=32,
                                           shuffle=True, generator=torch.Generator().manual_seed(2))
test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(test_x), batch_size=64)

# ------------------------------------------------------------------ model
class StraightThrough(torch.autograd.Function):
    """forward: return the quantised vectors; backward: copy gradient to the encoder output."""
    @staticmethod
    def forward(ctx, inputs, quantized):
        return quantized.clone()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None

class VectorQuantizerEMA(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, commitment_cost, decay, epsilon=1e-5):
        super().__init__()
        self._embedding_dim = embedding_dim
        self._num_embeddings = num_embeddings
        self._commitment_cost = commitment_cost
        self._decay = decay
        self._epsilon = epsilon
        embed = torch.randn(num_embeddings, embedding_dim)
        self.register_buffer("embed", embed)
        self.register_buffer("ema_cluster_size", torch.zeros(num_embeddings))
        self.register_buffer("ema_w", embed.clone())

    def forward(self, inputs):
        inputs = inputs.permute(0, 2, 3, 1).contiguous()          # BCHW -> BHWC
        input_shape = inputs.shape
        flat_input = inputs.view(-1, self._embedding_dim)
        distances = (flat_input.pow(2).sum(1, keepdim=True)
                     - 2 * flat_input @ self.embed.t()
                     + self.embed.pow(2).sum(1))
        encoding_indices = distances.argmin(1)
        encodings = F.one_hot(encoding_indices, self._num_embeddings).type(flat_input.dtype)
        quantized = F.embedding(encoding_indices, self.embed).view(input_shape)

        if self.training:
            with torch.no_grad():
                self.ema_cluster_size.mul_(self._decay).add_(encodings.sum(0), alpha=1 - self._decay)
                n = self.ema_cluster_size.sum()
                cluster_size = (self.ema_cluster_size + self._epsilon) / (n + self._num_embeddings * self._epsilon) * n
                dw = encodings.t() @ flat_input
                self.ema_w.mul_(self._decay).add_(dw, alpha=1 - self._decay)
                self.embed.copy_(self.ema_w / cluster_size.unsqueeze(1))

        e_latent_loss = F.mse_loss(inputs, quantized.detach())
        loss = self._commitment_cost * e_latent_loss
        quantized = StraightThrough.apply(inputs, quantized)
        avg_probs = encodings.mean(0)
        perplexity = torch.exp(-torch.sum(avg_probs * torch.log(avg_probs + 1e-10)))
        return loss, quantized.permute(0, 3, 1, 2).contiguous(), perplexity, encoding_indices

class Residual(nn.Module):
    def __init__(self, ch, hid):
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(ch, hid, 3, padding=1, bias=False),
                                   nn.ReLU(), nn.Conv2d(hid, ch, 1, bias=False))
    def forward(self, x):
        return x + self.block(x)

class Model(nn.Module):
    def __init__(self, hid=32, emb_dim=8, n_emb=32, commitment_cost=0.25, decay=0.9):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, hid // 2, 4, 2, 1), nn.ReLU(),
                                     nn.Conv2d(hid // 2, hid, 4, 2, 1), Residual(hid, 16), nn.ReLU())
        self.pre_vq = nn.Conv2d(hid, emb_dim, 1)
        self.vq = VectorQuantizerEMA(n_emb, emb_dim, commitment_cost, decay)
        self.decoder = nn.Sequential(nn.Conv2d(emb_dim, hid, 3, padding=1), Residual(hid, 16), nn.ReLU(),
                                     nn.ConvTranspose2d(hid, hid // 2, 4, 2, 1), nn.ReLU(),
                                     nn.ConvTranspose2d(hid // 2, 1, 4, 2, 1))
    def forward(self, x):
        z = self.pre_vq(self.encoder(x))
        loss, quantized, perplexity, _ = self.vq(z)
        return loss, self.decoder(quantized), perplexity

model = Model()
# initialise the codebook from encoder outputs of the first batch (common trick)
with torch.no_grad():
    z0 = model.pre_vq(model.encoder(train_x[:64])).permute(0, 2, 3, 1).reshape(-1, 8)
    idx = torch.randperm(z0.size(0))[:32]
    model.vq.embed.copy_(z0[idx]); model.vq.ema_w.copy_(z0[idx])
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, amsgrad=False)
print("trainable params:", sum(p.numel() for p in model.parameters() if p.requires_grad),
      "| codebook buffers are not parameters:", "vq.embed" not in dict(model.named_parameters()))

def evaluate():
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for (x,) in test_loader:
            _, x_recon, _ = model(x)
            tot += F.mse_loss(x_recon, x, reduction="sum").item(); n += x.numel()
    model.train()
    return tot / n / data_variance

step = 0
model.train()
for epoch in range(3):                       # 3 x 16 = 48 steps
    for (x,) in train_loader:
        optimizer.zero_grad()
        vq_loss, data_recon, perplexity = model(x)
        recon_error = F.mse_loss(data_recon, x) / data_variance
        loss = recon_error + vq_loss
        loss.backward()
        optimizer.step()
        step += 1
        if step % 8 == 0:
            print(f"step {step}: recon_error={recon_error.item():.4f} vq_loss={vq_loss.item():.4f} "
                  f"perplexity={perplexity.item():.2f}")
    print(f"epoch {epoch}: test normalised recon error {evaluate():.4f}")

torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, "vqvae_ema.pt")
model2 = Model()
ckpt = torch.load("vqvae_ema.pt")
model2.load_state_dict(ckpt["model"])
model.eval(); model2.eval()
with torch.no_grad():
    assert torch.allclose(model(test_x[:8])[1], model2(test_x[:8])[1])
print("checkpoint reload OK at step", ckpt["step"])
