"""DINO self-distillation with multi-crop on 2 gloo ranks (DDP student, EMA teacher).

Modelled on: facebookresearch/dino ``main_dino.py`` and ``utils.py`` (Caron et al.,
"Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021):
``DINOHead`` (MLP → L2-normalise → weight-normalised last layer with ``weight_g``
filled with 1 and frozen when ``norm_last_layer``), ``MultiCropWrapper`` (crops of equal
resolution are batched together), ``DINOLoss`` (teacher centring + sharpening with a
warm-up teacher temperature, centre updated through ``dist.all_reduce``),
``train_one_epoch`` (lr and weight-decay schedules written into the param groups every
iteration, wd only on group 0, ``clip_gradients`` per parameter,
``cancel_gradients_last_layer`` during ``freeze_last_layer`` epochs, EMA teacher update
with a cosine momentum schedule), ``get_params_groups`` and ``cosine_scheduler``.

What is unusual about the loop (all on purpose):
  * the teacher is not wrapped in DDP, has no optimizer and ``requires_grad=False``; it
    changes only by the EMA of the student and sees only the 2 global crops;
  * during epoch 0 the student's last layer gets gradients that are thrown away
    (``p.grad = None`` after backward), so it does not move while the rest does;
  * the weight-norm magnitude ``g`` (``original0``) is a frozen parameter at 1.0;
  * each rank draws its crops with its own generator (seed + rank), so ranks see
    different augmentations; weights stay identical through DDP's all-reduce (checked);
  * the ``center`` buffer is updated in the loss module, outside autograd, from the
    all-reduced teacher outputs; rank 0 alone runs a nearest-centroid probe at the end;
  * the head uses DINO's ``use_bn`` option; ``SyncBatchNorm`` is GPU-only, so batch
    statistics are per rank (student running stats are broadcast by DDP; the teacher,
    always in train mode, keeps rank-local running stats that are never read);
  * short-run settings: teacher momentum 0.9 -> 1 (DINO: 0.996), teacher temperature
    0.03 -> 0.04 over the first epoch.
"""
import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parametrizations
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)


def make_glyphs(n, seed):
    """3x16x16 glyphs of 4 classes (ring, square, plus, diagonal), random colour and position."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    labels, imgs = torch.randint(0, 4, (n,), generator=g), torch.zeros(n, 3, 16, 16)
    for i, lab in enumerate(labels.tolist()):
        dy, dx = [t - c for t, c in zip((yy, xx), (5 + 6 * torch.rand(2, generator=g)).tolist())]
        masks = [((dy ** 2 + dx ** 2).sqrt() - 3.5).abs() < 1.0, (dy.abs().maximum(dx.abs()) - 3.5).abs() < 1.0,
                 ((dy.abs() < 1) & (dx.abs() < 4.5)) | ((dx.abs() < 1) & (dy.abs() < 4.5)),
                 ((dy - dx).abs() < 1.2) & (dy.abs() < 4.5)]
        imgs[i] = masks[lab].float() * (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g))
    return imgs, labels


class DataAugmentationDINO:
    def __init__(self, generator, local_crops_number=2):
        self.g, self.local_crops_number = generator, local_crops_number

    def _jitter(self, x):  # per-image random flip + colour jitter
        x = torch.where(torch.rand(x.shape[0], 1, 1, 1, generator=self.g) < 0.5, x.flip(-1), x)
        return x * (0.6 + 0.8 * torch.rand(x.shape[0], 3, 1, 1, generator=self.g))

    def _crop(self, x, size, out):
        top, left = torch.randint(0, 16 - size + 1, (2,), generator=self.g).tolist()
        return F.interpolate(x[:, :, top: top + size, left: left + size], size=(out, out), mode="bilinear")

    def __call__(self, x):  # 2 global 16x16 crops, then local 8x8 crops
        return ([self._jitter(self._crop(x, 13, 16)) for _ in range(2)]
                + [self._jitter(self._crop(x, 8, 8)) for _ in range(self.local_crops_number)])


def backbone():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GELU(), nn.Conv2d(32, 64, 3, stride=2, padding=1),
                         nn.GELU(), nn.Conv2d(64, 64, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


class DINOHead(nn.Module):
    def __init__(self, in_dim, out_dim, use_bn=True, norm_last_layer=True, hidden_dim=128, bottleneck_dim=32):
        super().__init__()
        norm = (lambda: nn.BatchNorm1d(hidden_dim)) if use_bn else nn.Identity
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), norm(), nn.GELU(), nn.Linear(hidden_dim, hidden_dim),
                                 norm(), nn.GELU(), nn.Linear(hidden_dim, bottleneck_dim))
        self.apply(self._init_weights)
        self.last_layer = parametrizations.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.parametrizations.weight.original0.data.fill_(1)
        if norm_last_layer:
            self.last_layer.parametrizations.weight.original0.requires_grad = False

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.constant_(m.bias, 0)

    def forward(self, x):
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x):
        idx_crops = torch.cumsum(torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp in x]),
                                                          return_counts=True)[1], 0)
        start_idx, output = 0, []
        for end_idx in idx_crops:
            output.append(self.backbone(torch.cat(x[start_idx: end_idx])))
            start_idx = end_idx
        return self.head(torch.cat(output))


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs, nepochs,
                 student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp, self.center_momentum, self.ncrops = student_temp, center_momentum, ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp))

    def forward(self, student_output, teacher_output, epoch):
        student_out = (student_output / self.student_temp).chunk(self.ncrops)
        temp = self.teacher_temp_schedule[epoch]
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1).detach().chunk(2)
        total_loss, n_loss_terms = 0, 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                total_loss += torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1).mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        dist.all_reduce(batch_center)
        batch_center = batch_center / (len(teacher_output) * dist.get_world_size())
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    warmup_iters = warmup_epochs * niter_per_ep
    warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters) if warmup_epochs > 0 else np.array([])
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    return np.concatenate((warmup_schedule, schedule))


def get_params_groups(model):
    regularized, not_regularized = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (not_regularized if name.endswith(".bias") or len(param.shape) == 1 else regularized).append(param)
    return [{"params": regularized}, {"params": not_regularized, "weight_decay": 0.0}]


def clip_gradients(model, clip):
    norms = []
    for name, p in model.named_parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    epochs, batch_size, out_dim, freeze_last_layer = 3, 32, 64, 1
    images, labels = make_glyphs(640, seed=1)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    transform = DataAugmentationDINO(torch.Generator().manual_seed(100 + rank))

    student = DDP(MultiCropWrapper(backbone(), DINOHead(64, out_dim)))
    teacher = MultiCropWrapper(backbone(), DINOHead(64, out_dim))
    teacher.load_state_dict(student.module.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    dino_loss = DINOLoss(out_dim, ncrops=4, warmup_teacher_temp=0.03, teacher_temp=0.04,
                         warmup_teacher_temp_epochs=1, nepochs=epochs)
    optimizer = torch.optim.AdamW(get_params_groups(student))
    niter = len(loader)
    lr_schedule = cosine_scheduler(5e-3 * batch_size * world / 256, 1e-5, epochs, niter, warmup_epochs=1)
    wd_schedule = cosine_scheduler(0.04, 0.4, epochs, niter)
    momentum_schedule = cosine_scheduler(0.9, 1.0, epochs, niter)  # 0.996 in DINO; short run
    last_layer_start = student.module.head.last_layer.parametrizations.weight.original1.detach().clone()

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for it, (x, _) in enumerate(loader):
            it = niter * epoch + it
            for i, param_group in enumerate(optimizer.param_groups):
                param_group["lr"] = lr_schedule[it]
                if i == 0:
                    param_group["weight_decay"] = wd_schedule[it]
            crops = transform(x)
            teacher_output = teacher(crops[:2])
            student_output = student(crops)
            loss = dino_loss(student_output, teacher_output, epoch)
            if not math.isfinite(loss.item()):
                raise SystemExit(f"Loss is {loss.item()}, stopping training")
            optimizer.zero_grad()
            loss.backward()
            clip_gradients(student, 3.0)
            cancel_gradients_last_layer(epoch, student, freeze_last_layer)
            optimizer.step()
            with torch.no_grad():
                m = momentum_schedule[it]
                for param_q, param_k in zip(student.module.parameters(), teacher.parameters()):
                    param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
            if rank == 0 and it % 10 == 0:
                print(f"epoch {epoch} it {it}: loss {loss.item():.4f} lr {lr_schedule[it]:.2e} "
                      f"wd {wd_schedule[it]:.3f} momentum {m:.4f}")
        if rank == 0 and epoch == freeze_last_layer - 1:
            moved = (student.module.head.last_layer.parametrizations.weight.original1 - last_layer_start).abs().max()
            print(f"end of epoch {epoch}: last layer moved by {moved.item():.2e} (frozen on purpose)")

    flat = torch.cat([p.detach().flatten() for p in student.module.parameters()])  # must match across ranks
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = (flat - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"student max |rank0 - rankN| = {diff.item():.2e}")
        teacher.eval()
        with torch.no_grad():
            feats = F.normalize(teacher.backbone(images), dim=1)
        train_f, train_y, test_f, test_y = feats[:480], labels[:480], feats[480:], labels[480:]
        centroids = F.normalize(torch.stack([train_f[train_y == c].mean(0) for c in range(4)]), dim=1)
        acc = ((test_f @ centroids.T).argmax(1) == test_y).float().mean()
        print(f"teacher nearest-centroid probe accuracy {acc.item():.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
