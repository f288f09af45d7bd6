"""TabNet on a synthetic tabular task in Lightning, with the learning rate picked by Tuner.lr_find.

Modelled on: dreamquark-ai/pytorch-tabnet ``pytorch_tabnet/tab_network.py`` (``GBN`` ghost batch
norm over virtual batches, ``GLU_Layer``/``GLU_Block`` with sqrt(0.5) residual scaling and GLU
layers shared across decision steps, ``AttentiveTransformer`` with prior scaling and sparsemax,
``TabNetEncoder`` with the ``M_loss`` sparsity term, ``initialize_glu``/``initialize_non_glu``)
and ``pytorch_tabnet/sparsemax.py`` (``SparsemaxFunction``, a custom autograd Function with a
hand-written backward), trained as in ``abstract_model.py`` (loss = CE - lambda_sparse * M_loss,
Adam + StepLR, gradient clipping); plus the Lightning "Learning Rate Finder" docs
(``Tuner(trainer).lr_find(model)`` updating ``model.lr``).

Unusual but correct: ``lr_find`` first runs 20 optimizer steps with an exponentially growing
learning rate and then restores the initial weights and optimizer from a temporary checkpoint, so
the real fit starts again from the same initial parameters (a visible jump back in the weights and
loss); batch norm statistics are computed per virtual batch of 64 inside each batch of 256; the
shared GLU weights receive gradient from all decision steps; the attention masks come from a
custom autograd Function whose gradient is exactly zero outside the support.
"""
import math
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning.pytorch as pl
from lightning.pytorch.tuner import Tuner

torch.set_num_threads(1)


class SparsemaxFunction(torch.autograd.Function):
    """Sparsemax (Martins & Astudillo, 2016) over the last dimension."""

    @staticmethod
    def forward(ctx, input, dim=-1):
        ctx.dim = dim
        max_val, _ = input.max(dim=dim, keepdim=True)
        input = input - max_val                      # numerical stability
        srt, _ = torch.sort(input, descending=True, dim=dim)
        input_cumsum = srt.cumsum(dim) - 1
        rhos = torch.arange(1, input.size(dim) + 1, dtype=input.dtype, device=input.device)
        support = rhos * srt > input_cumsum
        supp_size = support.sum(dim=dim, keepdim=True)
        tau = input_cumsum.gather(dim, supp_size - 1) / supp_size.to(input.dtype)
        output = torch.clamp(input - tau, min=0)
        ctx.save_for_backward(supp_size, output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        supp_size, output = ctx.saved_tensors
        dim = ctx.dim
        grad_input = grad_output.clone()
        grad_input[output == 0] = 0
        v_hat = grad_input.sum(dim=dim, keepdim=True) / supp_size.to(output.dtype)
        grad_input = torch.where(output != 0, grad_input - v_hat, grad_input)
        return grad_input, None


def sparsemax(x):
    return SparsemaxFunction.apply(x, -1)


def initialize_non_glu(module, input_dim, output_dim):
    nn.init.xavier_normal_(module.weight, gain=math.sqrt((input_dim + output_dim) / math.sqrt(4 * input_dim)))


def initialize_glu(module, input_dim, output_dim):
    nn.init.xavier_normal_(module.weight, gain=math.sqrt((input_dim + output_dim) / math.sqrt(input_dim)))


class GBN(nn.Module):
    """Ghost batch norm: one BatchNorm1d applied separately to each virtual batch."""

    def __init__(self, input_dim, virtual_batch_size=64, momentum=0.02):
        super().__init__()
        self.virtual_batch_size = virtual_batch_size
        self.bn = nn.BatchNorm1d(input_dim, momentum=momentum)

    def forward(self, x):
        chunks = x.chunk(int(np.ceil(x.shape[0] / self.virtual_batch_size)), 0)
        return torch.cat([self.bn(x_) for x_ in chunks], dim=0)


class GLULayer(nn.Module):
    def __init__(self, input_dim, output_dim, fc=None, vbs=64):
        super().__init__()
        self.output_dim = output_dim
        self.fc = fc if fc is not None else nn.Linear(input_dim, 2 * output_dim, bias=False)
        if fc is None:
            initialize_glu(self.fc, input_dim, 2 * output_dim)
        self.bn = GBN(2 * output_dim, vbs)

    def forward(self, x):
        x = self.bn(self.fc(x))
        return x[:, :self.output_dim] * torch.sigmoid(x[:, self.output_dim:])


class GLUBlock(nn.Module):
    def __init__(self, input_dim, output_dim, n_glu=2, first=False, shared_layers=None, vbs=64):
        super().__init__()
        self.first = first
        self.glu_layers = nn.ModuleList()
        for i in range(n_glu):
            fc = shared_layers[i] if shared_layers else None
            self.glu_layers.append(GLULayer(input_dim if i == 0 else output_dim, output_dim, fc=fc, vbs=vbs))

    def forward(self, x):
        scale = math.sqrt(0.5)
        start = 0
        if self.first:                              # no residual on the very first layer
            x = self.glu_layers[0](x)
            start = 1
        for layer in self.glu_layers[start:]:
            x = (x + layer(x)) * scale
        return x


class FeatTransformer(nn.Module):
    def __init__(self, input_dim, output_dim, shared_layers, n_glu_independent=2, vbs=64):
        super().__init__()
        self.shared = GLUBlock(input_dim, output_dim, n_glu=len(shared_layers), first=True,
                               shared_layers=shared_layers, vbs=vbs)
        self.specifics = GLUBlock(output_dim, output_dim, n_glu=n_glu_independent, vbs=vbs)

    def forward(self, x):
        return self.specifics(self.shared(x))


class AttentiveTransformer(nn.Module):
    def __init__(self, input_dim, group_dim, vbs=64):
        super().__init__()
        self.fc = nn.Linear(input_dim, group_dim, bias=False)
        initialize_non_glu(self.fc, input_dim, group_dim)
        self.bn = GBN(group_dim, vbs)

    def forward(self, priors, processed_feat):
        return sparsemax(self.bn(self.fc(processed_feat)) * priors)


class TabNet(nn.Module):
    def __init__(self, input_dim, output_dim, n_d=8, n_a=8, n_steps=3, gamma=1.3, n_shared=2, vbs=64):
        super().__init__()
        self.n_d, self.n_steps, self.gamma = n_d, n_steps, gamma
        self.initial_bn = nn.BatchNorm1d(input_dim, momentum=0.01)
        shared = nn.ModuleList()
        for i in range(n_shared):
            fc = nn.Linear(input_dim if i == 0 else n_d + n_a, 2 * (n_d + n_a), bias=False)
            initialize_glu(fc, input_dim if i == 0 else n_d + n_a, 2 * (n_d + n_a))
            shared.append(fc)
        self.initial_splitter = FeatTransformer(input_dim, n_d + n_a, shared, vbs=vbs)
        self.feat_transformers = nn.ModuleList(
            [FeatTransformer(input_dim, n_d + n_a, shared, vbs=vbs) for _ in range(n_steps)])
        self.att_transformers = nn.ModuleList(
            [AttentiveTransformer(n_a, input_dim, vbs=vbs) for _ in range(n_steps)])
        self.final_mapping = nn.Linear(n_d, output_dim, bias=False)
        initialize_non_glu(self.final_mapping, n_d, output_dim)

    def forward(self, x):
        x = self.initial_bn(x)
        prior = torch.ones_like(x)
        m_loss, res, masks = 0.0, 0.0, []
        att = self.initial_splitter(x)[:, self.n_d:]
        for step in range(self.n_steps):
            m = self.att_transformers[step](prior, att)
            m_loss = m_loss + torch.mean(torch.sum(m * torch.log(m + 1e-15), dim=1))
            prior = (self.gamma - m) * prior
            out = self.feat_transformers[step](m * x)
            res = res + F.relu(out[:, :self.n_d])
            att = out[:, self.n_d:]
            masks.append(m)
        return self.final_mapping(res), m_loss / self.n_steps, masks


class TabNetClassifier(pl.LightningModule):
    def __init__(self, input_dim, n_classes, lr=2e-2, lambda_sparse=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.net = TabNet(input_dim, n_classes)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits, m_loss, _ = self(x)
        loss = F.cross_entropy(logits, y) - self.hparams.lambda_sparse * m_loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits, _, masks = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=False)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def make_data(n, seed):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, 12)).astype(np.float32)
    # only features 0, 3 and 7 matter
    y = ((x[:, 0] + 0.8 * x[:, 3] - np.abs(x[:, 7]) + 0.7 > 0)).astype(np.int64)
    return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def main():
    pl.seed_everything(7)
    train_dl = torch.utils.data.DataLoader(make_data(2048, 0), batch_size=256, shuffle=True, drop_last=True)
    val_dl = torch.utils.data.DataLoader(make_data(512, 1), batch_size=512)
    model = TabNetClassifier(input_dim=12, n_classes=2)

    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(max_epochs=6, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, gradient_clip_val=1.0,
                             default_root_dir=root)
        init_w = model.net.final_mapping.weight.detach().clone()
        lr_finder = Tuner(trainer).lr_find(model, train_dataloaders=train_dl, val_dataloaders=val_dl,
                                           min_lr=1e-4, max_lr=1.0, num_training=20)
        suggested = lr_finder.suggestion()
        print(f"lr_find tried {len(lr_finder.results['lr'])} lrs, suggestion {suggested}")
        assert torch.equal(init_w, model.net.final_mapping.weight), "lr_find restores the initial weights"
        model.lr = min(suggested if suggested is not None else 2e-2, 5e-2)
        print(f"training with lr={model.lr:.4g}")
        trainer.fit(model, train_dataloaders=train_dl, val_dataloaders=val_dl)
        print({k: round(float(v), 4) for k, v in trainer.callback_metrics.items()})

    model.eval()
    with torch.no_grad():
        x, _ = val_dl.dataset.tensors
        _, _, masks = model(x)
        importance = torch.stack(masks).sum(0).mean(0)
    print("feature importance (top 3):", importance.topk(3).indices.tolist())


if __name__ == "__main__":
    main()
