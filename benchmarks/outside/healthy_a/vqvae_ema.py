"""Healthy: zalandoresearch/pytorch-vq-vae (vq-vae.ipynb) VQ-VAE with VectorQuantizerEMA -- straight-through
estimator (quantized = inputs + (quantized - inputs).detach()), commitment loss, and the codebook updated by
exponential moving averages in training mode, exactly as the notebook does it: Laplace-smoothed cluster sizes and
`self._embedding.weight = nn.Parameter(self._ema_w / self._ema_cluster_size.unsqueeze(1))` every forward.
Adam over model.parameters() (amsgrad=False), reconstruction loss normalised by data variance, an eval pass."""
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
class VectorQuantizerEMA(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, commitment_cost, decay, epsilon=1e-5):
        super().__init__()
        self._embedding_dim = embedding_dim; self._num_embeddings = num_embeddings
        self._embedding = nn.Embedding(self._num_embeddings, self._embedding_dim)
        self._embedding.weight.data.normal_()
        self._commitment_cost = commitment_cost
        self.register_buffer('_ema_cluster_size', torch.zeros(num_embeddings))
        self._ema_w = nn.Parameter(torch.Tensor(num_embeddings, self._embedding_dim))
        self._ema_w.data.normal_()
        self._decay = decay; self._epsilon = epsilon
    def forward(self, inputs):
        inputs = inputs.permute(0, 2, 3, 1).contiguous(); input_shape = inputs.shape
        flat_input = inputs.view(-1, self._embedding_dim)
        distances = (torch.sum(flat_input ** 2, dim=1, keepdim=True) + torch.sum(self._embedding.weight ** 2, dim=1)
                     - 2 * torch.matmul(flat_input, self._embedding.weight.t()))
        encoding_indices = torch.argmin(distances, dim=1).unsqueeze(1)
        encodings = torch.zeros(encoding_indices.shape[0], self._num_embeddings, device=inputs.device)
        encodings.scatter_(1, encoding_indices, 1)
        quantized = torch.matmul(encodings, self._embedding.weight).view(input_shape)
        if self.training:
            self._ema_cluster_size = self._ema_cluster_size * self._decay + (1 - self._decay) * torch.sum(encodings, 0)
            n = torch.sum(self._ema_cluster_size.data)
            self._ema_cluster_size = ((self._ema_cluster_size + self._epsilon) / (n + self._num_embeddings * self._epsilon) * n)
            dw = torch.matmul(encodings.t(), flat_input)
            self._ema_w = nn.Parameter(self._ema_w * self._decay + (1 - self._decay) * dw)
            self._embedding.weight = nn.Parameter(self._ema_w / self._ema_cluster_size.unsqueeze(1))
        e_latent_loss = F.mse_loss(quantized.detach(), inputs)
        loss = self._commitment_cost * e_latent_loss
        quantized = inputs + (quantized - inputs).detach()
        avg_probs = torch.mean(encodings, dim=0)
        perplexity = torch.exp(-torch.sum(avg_probs * torch.log(avg_probs + 1e-10)))
        return loss, quantized.permute(0, 3, 1, 2).contiguous(), perplexity, encodings
class Model(nn.Module):
    def __init__(self, h=32, d=16, k=64):
        super().__init__()
        self._encoder = nn.Sequential(nn.Conv2d(3, h, 4, 2, 1), nn.ReLU(), nn.Conv2d(h, h, 4, 2, 1), nn.ReLU(), nn.Conv2d(h, h, 3, 1, 1))
        self._pre_vq_conv = nn.Conv2d(h, d, 1)
        self._vq_vae = VectorQuantizerEMA(k, d, 0.25, 0.99)
        self._decoder = nn.Sequential(nn.Conv2d(d, h, 3, 1, 1), nn.ReLU(), nn.ConvTranspose2d(h, h, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(h, 3, 4, 2, 1))
    def forward(self, x):
        z = self._pre_vq_conv(self._encoder(x))
        loss, quantized, perplexity, _ = self._vq_vae(z)
        return loss, self._decoder(quantized), perplexity
def data(n):
    g = torch.linspace(0, 1, 16)
    f = torch.rand(n, 3, 1, 1) * 6
    return torch.sin(f * g[None, None, :, None] + f.flip(1) * g[None, None, None, :]) * 0.5
data_variance = data(512).var().item()
model = Model(); optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=False)
model.train()
for i in range(40):
    x = data(32)
    optimizer.zero_grad()
    vq_loss, data_recon, perplexity = model(x)
    recon_error = F.mse_loss(data_recon, x) / data_variance
    loss = recon_error + vq_loss
    loss.backward()
    optimizer.step()
    if (i + 1) % 10 == 0:
        model.eval()
        with torch.no_grad():
            xv = data(64); _, rv, pv = model(xv)
        model.train()
        print(f"{i+1} recon {recon_error.item():.3f} ppl {perplexity.item():.1f} val {F.mse_loss(rv, xv).item()/data_variance:.3f}")
