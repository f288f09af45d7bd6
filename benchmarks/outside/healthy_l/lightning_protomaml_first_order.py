"""First-order ProtoMAML few-shot classification in PyTorch Lightning.

Modelled on: the UvA Deep Learning course, Tutorial 16 "Meta-Learning - Learning to Learn"
(phlippe/uvadlc_notebooks, ``docs/tutorial_notebooks/tutorial16/Meta_Learning.ipynb``), class
``ProtoMAML``: ``adapt_few_shot`` computes class prototypes with the meta-model, deep-copies the
meta-model into a ``local_model`` with its own ``optim.SGD``, initialises the output layer as
``W = 2 * prototypes, b = -||prototypes||^2`` and takes inner SGD steps (the output layer is
updated by hand through ``.data``); the prototype graph is re-attached with
``(w - init_w).detach() + init_w``; in ``outer_loop`` the query loss is back-propagated and the
fine-tuned copy's gradients are *added* to the meta-model's (``p_global.grad += p_local.grad``,
the first-order MAML approximation) before the meta-optimizer steps.  Tasks are synthetic
5-way 4-shot problems over procedurally generated glyph classes (disjoint train/val classes).

Unusual (but intended) things about the loop:
* manual optimization: one ``opt.step()`` per batch of 4 tasks, ``manual_backward`` once per
  task, and meta-gradients assembled by hand from a deep copy that is then discarded;
* validation *needs* gradients (it adapts to each task), so it runs with
  ``Trainer(inference_mode=False)`` and ``torch.set_grad_enabled(True)`` inside
  ``validation_step``; the meta-model itself is never updated there;
* BatchNorm keeps no running statistics (``track_running_stats=False``), so eval mode still
  normalises with the task's batch statistics;
* the output layer is not a module parameter at all (rebuilt from prototypes for every task),
  validation runs mid-epoch (every 20 meta-steps) on fixed, seeded tasks.
"""
from copy import deepcopy

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)

N_WAY, K_SHOT, N_QUERY, IMG = 5, 4, 4, 16


def make_glyphs(n_classes, seed):
    g = torch.Generator().manual_seed(seed)
    base = (torch.rand(n_classes, 1, IMG, IMG, generator=g) > 0.7).float()
    return F.avg_pool2d(base, 3, stride=1, padding=1)  # smooth blobs


class TaskDataset(torch.utils.data.Dataset):
    """Each item is one N-way task: (images, global class ids), support+query per class."""

    def __init__(self, glyphs, class_ids, n_tasks, seed):
        self.glyphs, self.class_ids, self.n_tasks, self.seed = glyphs, class_ids, n_tasks, seed

    def __len__(self):
        return self.n_tasks

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(self.seed * 100003 + idx)
        chosen = self.class_ids[torch.randperm(len(self.class_ids), generator=g)[:N_WAY]]
        imgs, targets = [], []
        for c in chosen:
            n = K_SHOT + N_QUERY
            x = self.glyphs[c].expand(n, -1, -1, -1)
            shifts = torch.randint(-2, 3, (n, 2), generator=g)
            x = torch.stack([torch.roll(x[i], tuple(shifts[i].tolist()), dims=(1, 2)) for i in range(n)])
            imgs.append(x + 0.15 * torch.randn(x.shape, generator=g))
            targets.append(torch.full((n,), int(c)))
        return torch.cat(imgs), torch.cat(targets)


def split_batch(imgs, targets):
    per_class = K_SHOT + N_QUERY
    idx = torch.arange(len(targets)) % per_class
    s, q = idx < K_SHOT, idx >= K_SHOT
    return imgs[s], imgs[q], targets[s], targets[q]


def get_convnet(output_size):
    # Transductive BatchNorm (batch statistics in train *and* eval mode), as in Finn et al.'s MAML
    # code: the prototypes (meta-model) and the adapted copy then see identically normalised features.
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout, track_running_stats=False), nn.ReLU(), nn.MaxPool2d(2))
    return nn.Sequential(block(1, 32), block(32, 32), block(32, 32), nn.Flatten(), nn.Linear(32 * 2 * 2, output_size))


def calculate_prototypes(features, targets):
    classes, _ = torch.unique(targets).sort()
    prototypes = torch.stack([features[torch.where(targets == c)[0]].mean(dim=0) for c in classes], dim=0)
    return prototypes, classes


class ProtoMAML(L.LightningModule):
    def __init__(self, proto_dim=32, lr=3e-3, lr_inner=0.1, lr_output=0.1, num_inner_steps=1):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model = get_convnet(output_size=self.hparams.proto_dim)

    def configure_optimizers(self):
        optimizer = optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=[30], gamma=0.1)
        return [optimizer], [scheduler]

    def run_model(self, local_model, output_weight, output_bias, imgs, labels):
        feats = local_model(imgs)
        preds = F.linear(feats, output_weight, output_bias)
        loss = F.cross_entropy(preds, labels)
        acc = (preds.argmax(dim=1) == labels).float()
        return loss, preds, acc

    def adapt_few_shot(self, support_imgs, support_targets):
        support_feats = self.model(support_imgs)
        prototypes, classes = calculate_prototypes(support_feats, support_targets)
        support_labels = (classes[None, :] == support_targets[:, None]).long().argmax(dim=-1)
        local_model = deepcopy(self.model)
        local_model.train()
        local_optim = optim.SGD(local_model.parameters(), lr=self.hparams.lr_inner)
        local_optim.zero_grad()
        init_weight = 2 * prototypes
        init_bias = -torch.norm(prototypes, dim=1) ** 2
        output_weight = init_weight.detach().requires_grad_()
        output_bias = init_bias.detach().requires_grad_()
        for _ in range(self.hparams.num_inner_steps):
            loss, _, _ = self.run_model(local_model, output_weight, output_bias, support_imgs, support_labels)
            loss.backward()
            local_optim.step()
            output_weight.data -= self.hparams.lr_output * output_weight.grad
            output_bias.data -= self.hparams.lr_output * output_bias.grad
            local_optim.zero_grad()
            output_weight.grad.fill_(0)
            output_bias.grad.fill_(0)
        # re-attach the computation graph of the prototypes
        output_weight = (output_weight - init_weight).detach() + init_weight
        output_bias = (output_bias - init_bias).detach() + init_bias
        return local_model, output_weight, output_bias, classes

    def outer_loop(self, batch, mode="train"):
        accuracies, losses = [], []
        for imgs, targets in batch:
            support_imgs, query_imgs, support_targets, query_targets = split_batch(imgs, targets)
            local_model, output_weight, output_bias, classes = self.adapt_few_shot(support_imgs, support_targets)
            query_labels = (classes[None, :] == query_targets[:, None]).long().argmax(dim=-1)
            loss, _, acc = self.run_model(local_model, output_weight, output_bias, query_imgs, query_labels)
            if mode == "train":
                self.manual_backward(loss)
                for p_global, p_local in zip(self.model.parameters(), local_model.parameters()):
                    p_global.grad += p_local.grad  # first-order approx.
            accuracies.append(acc.mean().detach())
            losses.append(loss.detach())
        loss, acc = torch.stack(losses).mean(), torch.stack(accuracies).mean()
        self.log(f"{mode}_loss", loss, batch_size=len(batch))
        self.log(f"{mode}_acc", acc, batch_size=len(batch), prog_bar=True)
        return loss, acc

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss, acc = self.outer_loop(batch, mode="train")
        opt.step()
        self.lr_schedulers().step()
        if self.global_step % 10 == 0:
            print(f"meta-step {self.global_step:3d}  query loss {loss.item():.4f}  acc {acc.item():.3f}")

    def validation_step(self, batch, batch_idx):
        # validation requires fine-tuning on the support set, hence gradients
        torch.set_grad_enabled(True)
        self.outer_loop(batch, mode="val")
        torch.set_grad_enabled(False)

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        print(f"[val @ meta-step {self.global_step}] loss {m['val_loss']:.4f}  acc {m['val_acc']:.3f}")


def main():
    glyphs = make_glyphs(40, seed=123)
    train_set = TaskDataset(glyphs, torch.arange(0, 30), n_tasks=160, seed=1)
    val_set = TaskDataset(glyphs, torch.arange(30, 40), n_tasks=8, seed=2)
    collate = lambda tasks: tasks  # a batch is a list of tasks
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=4, shuffle=True, collate_fn=collate)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=4, shuffle=False, collate_fn=collate)

    model = ProtoMAML()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, val_check_interval=20,
                        inference_mode=False, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(model, train_loader, val_loader)
    print(f"meta-optimizer steps: {trainer.global_step}")


if __name__ == "__main__":
    main()
