"""Modelled on facebookresearch/moco (main_moco.py + moco/builder.py, MoCo v2).

Exercises contrastive learning with a momentum (key) encoder: the key encoder is a copy of
the query encoder whose parameters have requires_grad=False and are updated only by an
exponential moving average under torch.no_grad(); a FIFO queue of negative keys is a buffer
that is overwritten every step (dequeue-and-enqueue). Only the query encoder is in the
SGD optimizer. Data are two noisy "augmented views" of synthetic prototype vectors.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


class MoCo(nn.Module):
    def __init__(self, base_encoder, dim=32, K=256, m=0.99, T=0.2):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)  # initialize
            param_k.requires_grad = False  # not update by gradient
        self.register_buffer("queue", torch.randn(dim, K))
        self.queue = nn.functional.normalize(self.queue, dim=0)
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        ptr = (ptr + batch_size) % self.K
        self.queue_ptr[0] = ptr

    def forward(self, im_q, im_k):
        q = nn.functional.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            k = nn.functional.normalize(self.encoder_k(im_k), dim=1)
        l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [q, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


def mlp_encoder(num_classes):
    # MoCo v2 uses an MLP head on top of the backbone
    return nn.Sequential(nn.Linear(48, 128), nn.BatchNorm1d(128), nn.ReLU(),
                         nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, num_classes))


protos = torch.randn(10, 48) * 2


def two_crops(bs):
    idx = torch.randint(0, 10, (bs,))
    base = protos[idx]
    aug = lambda x: x * (1 + 0.2 * torch.randn_like(x)) + 0.3 * torch.randn_like(x)
    return aug(base), aug(base), idx


model = MoCo(mlp_encoder)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9, weight_decay=1e-4)
# parameters() includes encoder_k's frozen params; SGD skips them because their grad stays None

steps, bs = 40, 32
for it in range(steps):
    lr = 0.06 * 0.5 * (1 + torch.cos(torch.tensor(it / steps * 3.14159)).item())  # cosine lr
    for g in optimizer.param_groups:
        g["lr"] = lr
    im_q, im_k, _ = two_crops(bs)
    output, target = model(im_q=im_q, im_k=im_k)
    loss = criterion(output, target)
    acc1 = (output.argmax(1) == target).float().mean().item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print(f"it {it:3d} loss {loss.item():.4f} acc@1 {acc1:.3f} lr {lr:.4f}")

# linear-probe style sanity check: nearest prototype with the frozen query encoder
model.eval()
with torch.no_grad():
    x, _, y = two_crops(256)
    feats = F.normalize(model.encoder_q(x), dim=1)
    cent = F.normalize(model.encoder_q(protos), dim=1)
    print("kNN-to-prototype acc:", (feats @ cent.T).argmax(1).eq(y).float().mean().item())
