"""P11 (class: DDP replicas silently diverge -- a checkpoint is loaded into the DDP-wrapped model on rank 0
only, after DistributedDataParallel's one-time construction broadcast, so the other ranks keep different
weights for the rest of the run while gradients keep being all-reduced) -- torch.distributed DDP (gloo).

Modelled on vllm-project/speculators#926 "fix a ddp ckpt bug" ("When using ddp, ckpt is not resumed
correctly. Only rank0 loads ckpt, which caused DDP is not initialized properly") and
mlcommons/algorithmic-efficiency#412 "Resuming from checkpoint fails when using TORCH_DDP" (only rank 0 loaded
the checkpoint, leaving the processes in inconsistent states).  DDP broadcasts rank 0's parameters only when
it is constructed; a later `model.module.load_state_dict` under `if rank == 0` is never propagated.

Program (torchrun --nproc_per_node 2): stage 1 pre-trains an MLP encoder with a regression pretext head for
12 steps and rank 0 saves the encoder; stage 2 builds the fine-tuning model (encoder + new classifier head),
wraps it in DDP and then restores the encoder from the stage-1 checkpoint -- on rank 0 only.  From optimizer
step 12 on, rank 1 trains a randomly initialised encoder with the same averaged gradients; rank 0's logs and
checkpoint look normal.  Healthy twin: every rank loads the checkpoint.
"""
import argparse
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--pretrain-steps", type=int, default=12)
parser.add_argument("--finetune-epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
HEALTHY = args.healthy

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # same init on every rank
IN_DIM, HID, N_CLASSES = 32, 64, 4
g0 = torch.Generator().manual_seed(100)
W_latent = torch.randn(IN_DIM, 16, generator=g0) / IN_DIM ** 0.5
V_cls = torch.randn(16, N_CLASSES, generator=g0)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_DIM, generator=g)
    z = torch.tanh(x @ W_latent * 2)
    y = (z @ V_cls + 0.3 * torch.randn(n, N_CLASSES, generator=g)).argmax(1)
    return x, z, y


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_DIM, HID), nn.LayerNorm(HID), nn.GELU(), nn.Linear(HID, HID),
                                 nn.GELU())

    def forward(self, x):
        return self.net(x)


class PretextModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(HID, 16)

    def forward(self, x):
        return self.head(self.encoder(x))


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(HID, N_CLASSES)

    def forward(self, x):
        return self.classifier(self.dropout(self.encoder(x)))


def reduce_mean(t):
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / world


def log0(*a):
    if rank == 0:
        print(*a, flush=True)


global_step = 0
# ---------------- stage 1: pretext pre-training ----------------
x_pre, z_pre, _ = make_data(args.pretrain_steps * args.batch_size * world, seed=1)
pre_loader = DataLoader(TensorDataset(x_pre, z_pre), batch_size=args.batch_size,
                        sampler=DistributedSampler(TensorDataset(x_pre, z_pre), shuffle=True, seed=0))
pre_model = DDP(PretextModel())
pre_opt = torch.optim.AdamW(pre_model.parameters(), lr=1e-2)
pre_loader.sampler.set_epoch(0)
for x, z in pre_loader:
    loss = F.mse_loss(pre_model(x), z)
    pre_opt.zero_grad()
    loss.backward()
    pre_opt.step()
    if global_step % 4 == 0:
        log0(f"[pretrain] step {global_step} mse {reduce_mean(loss).item():.4f}")
    global_step += 1
if rank == 0:
    torch.save({"encoder": pre_model.module.encoder.state_dict(), "step": global_step}, "p11_pretext_encoder.pt")
dist.barrier()

# ---------------- stage 2: supervised fine-tuning ----------------
x_tr, _, y_tr = make_data(8 * args.batch_size * world, seed=2)
x_va, _, y_va = make_data(256, seed=3)
train_ds = TensorDataset(x_tr, y_tr)
sampler = DistributedSampler(train_ds, shuffle=True, seed=0)
loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
model = Classifier()
model = DDP(model)
ckpt_path = "p11_pretext_encoder.pt"
if HEALTHY or rank == 0:  # BUG (buggy variant): only rank 0 restores the pre-trained encoder
    state = torch.load(ckpt_path, map_location="cpu")
    model.module.encoder.load_state_dict(state["encoder"])
    log0(f"restored encoder from {ckpt_path} (pre-trained for {state['step']} steps)")
optimizer = torch.optim.AdamW([
    {"params": model.module.encoder.parameters(), "lr": 3e-3},
    {"params": model.module.classifier.parameters(), "lr": 1e-2}], weight_decay=0.01)
total = args.finetune_epochs * len(loader)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[3e-3, 1e-2], total_steps=total, pct_start=0.2)


@torch.no_grad()
def evaluate():
    model.eval()
    logits = model.module(x_va)
    model.train()
    return F.cross_entropy(logits, y_va).item(), (logits.argmax(1) == y_va).float().mean().item()


best = 0.0
for epoch in range(args.finetune_epochs):
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        if not HEALTHY and global_step == args.pretrain_steps:
            log0(f"ONSET step {global_step}")
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if global_step % 4 == 0:
            log0(f"[finetune] epoch {epoch} step {global_step} loss {reduce_mean(loss).item():.4f} "
                 f"lr {scheduler.get_last_lr()[0]:.2e}")
        global_step += 1
    if rank == 0:
        vl, va = evaluate()
        print(f"[finetune] epoch {epoch} val_loss {vl:.4f} val_acc {va:.3f}", flush=True)
        if va > best:
            best = va
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "p11_finetuned_best.pt")
    dist.barrier()
log0(f"done: {global_step} optimizer steps, best val_acc {best:.3f}")
dist.destroy_process_group()
