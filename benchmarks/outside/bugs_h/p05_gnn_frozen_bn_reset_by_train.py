"""Graph property regression with a GCN encoder (BatchNorm) and a frozen-encoder fine-tuning phase.

Small random molecules-like graphs are batched as block-diagonal normalised adjacency matrices.
The encoder is trained jointly with the readout head for the first epoch; then the encoder is
frozen with the model's `freeze_encoder()` helper (requires_grad=False plus BatchNorm put into
eval mode) and only the head is trained.  Each epoch begins with the usual `model.train()`.

Modelled on: pgniewko/gt-pyg issue #112 "`freeze()` BatchNorm eval mode is reset by the next
model.train()" — freeze() sets the frozen BatchNorm modules to eval once, but nn.Module.train()
recurses into every submodule, so the next model.train() puts them back in training mode:
running_mean/var are overwritten by the fine-tuning batches and the "frozen" encoder normalises
with batch statistics, while get_frozen_status() still reports True.

Unusual about the loop: the freeze happens at an epoch boundary mid-run, immediately followed by
the epoch's model.train(), so the frozen phase never actually has frozen BatchNorm.
--healthy: the model overrides train() to keep the BatchNorm layers of a frozen encoder in eval
mode (the fix proposed in the issue).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

FEAT = 8


def random_graph(g):
    n = int(torch.randint(6, 13, (1,), generator=g))
    a = (torch.rand(n, n, generator=g) < 0.3).float().triu(1)
    a = a + a.T
    x = torch.randn(n, FEAT, generator=g) + 0.5
    deg = a.sum(1)
    y = (x[:, 0] * deg).mean() + 0.3 * x[:, 1].max()
    return a, x, y


def collate(graphs):
    n_tot = sum(a.shape[0] for a, _, _ in graphs)
    adj = torch.zeros(n_tot, n_tot)
    batch, xs, ys, off = [], [], [], 0
    for gi, (a, x, y) in enumerate(graphs):
        n = a.shape[0]
        adj[off:off + n, off:off + n] = a + torch.eye(n)
        xs.append(x)
        ys.append(y)
        batch.append(torch.full((n,), gi))
        off += n
    dinv = adj.sum(1).rsqrt()
    return dinv[:, None] * adj * dinv[None, :], torch.cat(xs), torch.cat(batch), torch.stack(ys)


class GCNLayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.norm = nn.BatchNorm1d(d_out)

    def forward(self, adj, h):
        return F.relu(self.norm(adj @ self.lin(h)))


class GraphRegressor(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.encoder = nn.ModuleList([GCNLayer(FEAT, hidden), GCNLayer(hidden, hidden), GCNLayer(hidden, hidden)])
        self.head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.encoder_frozen = False

    def encode(self, adj, x, batch, n_graphs):
        h = x
        for layer in self.encoder:
            h = layer(adj, h)
        mean = torch.zeros(n_graphs, h.shape[1]).index_add_(0, batch, h) / torch.bincount(batch)[:, None]
        mx = torch.full((n_graphs, h.shape[1]), -1e9).scatter_reduce(0, batch[:, None].expand_as(h), h, "amax")
        return torch.cat([mean, mx], dim=1)

    def forward(self, adj, x, batch, n_graphs):
        return self.head(self.encode(adj, x, batch, n_graphs)).squeeze(1)

    def freeze_encoder(self):
        self.encoder_frozen = True
        for p in self.encoder.parameters():
            p.requires_grad = False
        for m in self.encoder.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.eval()

    def train(self, mode=True):
        super().train(mode)
        if HEALTHY and self.encoder_frozen:
            for m in self.encoder.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.eval()
        return self


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    train = [random_graph(g) for _ in range(160)]
    val = collate([random_graph(g) for _ in range(64)])
    model = GraphRegressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    bs, epochs, freeze_epoch = 16, 3, 1

    step = 0
    for epoch in range(epochs):
        if epoch == freeze_epoch:
            model.freeze_encoder()
            bn = model.encoder[0].norm
            stats_at_freeze = (bn.running_mean.clone(), bn.running_var.clone())
            with torch.no_grad():
                model.eval()
                emb_at_freeze = model.encode(*val[:3], 64).clone()
            if not HEALTHY:
                print(f"ONSET step {step}")
        model.train()
        bn_mode_in_epoch = model.encoder[0].norm.training
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(100 + epoch))
        for b in range(0, len(train), bs):
            adj, x, batch, y = collate([train[i] for i in order[b:b + bs]])
            pred = model(adj, x, batch, len(y))
            loss = F.mse_loss(pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f}")
            step += 1
        model.eval()
        with torch.no_grad():
            val_loss = F.mse_loss(model(*val[:3], 64), val[3]).item()
        print(f"  [val] epoch {epoch} mse {val_loss:.4f}")

    bn = model.encoder[0].norm
    with torch.no_grad():
        emb_drift = (model.encode(*val[:3], 64) - emb_at_freeze).norm().item()
    print(f"EVIDENCE frozen_bn_running_mean_drift={(bn.running_mean - stats_at_freeze[0]).norm():.4f} "
          f"frozen_bn_running_var_drift={(bn.running_var - stats_at_freeze[1]).norm():.4f} "
          f"frozen_encoder_output_drift={emb_drift:.4f} frozen_bn_in_train_mode={bn_mode_in_epoch} "
          f"val_mse={val_loss:.4f}")


if __name__ == "__main__":
    main()
