"""Semi-supervised shape classification with an EMA ("mean") teacher that pseudo-labels unlabeled data.

Modelled on: CuriousAI/mean-teacher#9 "EMA of BatchNorm Layer" -- ``update_ema_variables`` in the
PyTorch mean-teacher code loops over ``ema_model.parameters()`` only, so the BatchNorm running
mean / variance buffers of the EMA model are never updated and the teacher "may be using the
default 0-mean and 1-var".  The fix (as in timm's ModelEmaV2, ignite's EMAHandler
``handle_buffers``) also copies / averages the buffers.

What is unusual about the loop: the teacher is only created after a supervised warm-up
(``--ema-start`` steps), as a fresh ``create_model(ema=True)`` instance whose first EMA update is
a plain copy (alpha = 0); from then on the teacher runs in eval mode to produce sharpened soft
pseudo-labels for a consistency loss on noised unlabeled images.  The first optimizer step that
uses the teacher is the first wrong one.  ``--healthy`` also carries the buffers over.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

SIZE, N_CLASSES = 16, 4


def render(labels, gen):
    """Class 0: horizontal bar, 1: vertical bar, 2: ring, 3: filled square; random position/contrast."""
    n = labels.shape[0]
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    cy = 4 + 8 * torch.rand(n, 1, 1, generator=gen)
    cx = 4 + 8 * torch.rand(n, 1, 1, generator=gen)
    dy, dx = yy - cy, xx - cx
    shapes = torch.stack([
        ((dy.abs() < 1.5) & (dx.abs() < 5)).float(),
        ((dx.abs() < 1.5) & (dy.abs() < 5)).float(),
        (((dy ** 2 + dx ** 2).sqrt() - 3.5).abs() < 1.0).float(),
        ((dy.abs() < 3) & (dx.abs() < 3)).float(),
    ], 1)
    img = shapes[torch.arange(n), labels]
    contrast = 0.5 + torch.rand(n, 1, 1, generator=gen)
    img = 0.3 + contrast * img + 0.15 * torch.randn(n, SIZE, SIZE, generator=gen)
    return img.unsqueeze(1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.LeakyReLU(0.1), nn.MaxPool2d(2))
        self.features = nn.Sequential(block(1, 16), block(16, 32), block(32, 32))
        self.fc = nn.Linear(32 * 2 * 2, N_CLASSES)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def create_model(ema=False):
    model = ConvNet()
    if ema:
        for param in model.parameters():
            param.detach_()
    return model


def update_ema_variables(model, ema_model, alpha, global_step, with_buffers):
    # Use the true average until the exponential average is more correct
    alpha = min(1 - 1 / (global_step + 1), alpha)
    for ema_param, param in zip(ema_model.parameters(), model.parameters()):
        ema_param.data.mul_(alpha).add_(param.data, alpha=1 - alpha)
    if with_buffers:
        for ema_buf, buf in zip(ema_model.buffers(), model.buffers()):
            if ema_buf.dtype.is_floating_point:
                ema_buf.data.mul_(alpha).add_(buf.data, alpha=1 - alpha)
            else:
                ema_buf.data.copy_(buf.data)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ema-start", type=int, default=15)
    p.add_argument("--ema-decay", type=float, default=0.95)
    p.add_argument("--consistency", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    y_lab = torch.arange(128) % N_CLASSES
    x_lab = render(y_lab, gen)
    y_unl = torch.randint(0, N_CLASSES, (1024,), generator=gen)
    x_unl = render(y_unl, gen)
    y_test = torch.randint(0, N_CLASSES, (256,), generator=gen)
    x_test = render(y_test, gen)

    model = create_model()
    ema_model = None
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)

    for step in range(args.steps):
        if step == args.ema_start:
            ema_model = create_model(ema=True)
            update_ema_variables(model, ema_model, args.ema_decay, 0, args.healthy)
            if not args.healthy:
                print(f"ONSET step {step}")
        model.train()
        li = torch.randint(0, x_lab.shape[0], (32,), generator=gen)
        ui = torch.randint(0, x_unl.shape[0], (64,), generator=gen)
        class_loss = F.cross_entropy(model(x_lab[li]), y_lab[li])
        loss = class_loss
        cons_loss = torch.zeros(())
        if ema_model is not None:
            weak = x_unl[ui]
            strong = weak + 0.25 * torch.randn(weak.shape, generator=gen)
            ema_model.eval()
            with torch.no_grad():
                t = torch.softmax(ema_model(weak) / 0.5, dim=1)  # sharpened soft pseudo-labels
            cons_loss = F.kl_div(F.log_softmax(model(strong), 1), t, reduction="batchmean")
            loss = loss + args.consistency * cons_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if ema_model is not None:
            update_ema_variables(model, ema_model, args.ema_decay, step - args.ema_start + 1, args.healthy)
        if step % 5 == 4:
            msg = f"step {step:3d} class_loss {class_loss.item():.4f} cons_loss {cons_loss.item():.4f} " \
                  f"student_acc {accuracy(model, x_test, y_test):.3f}"
            if ema_model is not None:
                msg += f" teacher_acc {accuracy(ema_model, x_test, y_test):.3f}"
            print(msg)

    bn_s, bn_t = model.features[0][1], ema_model.features[0][1]
    gap = (bn_s.running_mean - bn_t.running_mean).abs().max().item()
    print(f"EVIDENCE teacher bn1 running_mean max|diff to student| {gap:.4f}; teacher bn1 "
          f"running_var mean {bn_t.running_var.mean().item():.4f} (student "
          f"{bn_s.running_var.mean().item():.4f}); teacher_acc {accuracy(ema_model, x_test, y_test):.3f}")


if __name__ == "__main__":
    main()
