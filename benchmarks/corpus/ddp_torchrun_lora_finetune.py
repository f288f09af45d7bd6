"""LoRA fine-tuning of a frozen transformer classifier, data-parallel over 2 ranks under torchrun.

Modelled on: the LoRA recipe as hand-written in microsoft/LoRA loralib/layers.py and the
single-file fine-tuning scripts built on it (and torchtune's lora_finetune_distributed
recipe), launched the torchrun way.  Habits reproduced: ``LOCAL_RANK``/``RANK``/``WORLD_SIZE``
from the environment and ``init_process_group("gloo")``; a "pretrained" base written to and
loaded back from a checkpoint, then frozen with ``requires_grad_(False)``; ``LoRALinear``
wrappers on the query/value projections (A with kaiming-uniform init, B zeros, scaling
``alpha / r``, dropout on the adapter path); a trainable classification head
(``modules_to_save``); a ``print_trainable_parameters``-style report; AdamW over the
trainable parameters only; DDP; ``clip_grad_norm_`` over those parameters; warm-up +
cosine ``LambdaLR``; rank-0 logging of the all-reduced loss; periodic evaluation under
``torch.inference_mode``; rank 0 saving only the adapter weights, then a barrier.
"""

import argparse
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, SEQ_LEN, DIM, HEADS, CLASSES = 64, 12, 32, 4, 3


class LoRALinear(nn.Module):
    """y = base(x) + B(A(dropout(x))) * alpha / r with the base layer frozen."""

    def __init__(self, base: nn.Linear, r: int = 4, alpha: int = 8, dropout: float = 0.05):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(dropout)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + (self.lora_dropout(x) @ self.lora_A.t() @ self.lora_B.t()) * self.scaling


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.q_proj = nn.Linear(DIM, DIM)
        self.k_proj = nn.Linear(DIM, DIM)
        self.v_proj = nn.Linear(DIM, DIM)
        self.o_proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).view(b, t, HEADS, DIM // HEADS).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class Classifier(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ_LEN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.score = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.score(self.norm(x).mean(dim=1))


def inject_lora(model: Classifier, r: int, alpha: int):
    model.requires_grad_(False)
    for block in model.blocks:
        block.q_proj = LoRALinear(block.q_proj, r, alpha)
        block.v_proj = LoRALinear(block.v_proj, r, alpha)
    # the new task's head is trained in full
    model.score.reset_parameters()
    model.score.requires_grad_(True)


def print_trainable_parameters(model):
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.2f}")


def synthetic_task(n, seed):
    """Label = which third of the vocabulary the most frequent token class falls in."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=g)
    labels = torch.div(ids, VOCAB // CLASSES + 1, rounding_mode="floor").mode(dim=1).values
    return TensorDataset(ids, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-r", type=int, default=4)
    parser.add_argument("--lora-alpha", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    is_main = rank == 0

    ckpt_dir = [tempfile.mkdtemp(prefix="lora_") if is_main else None]
    dist.broadcast_object_list(ckpt_dir, src=0)
    ckpt_dir = ckpt_dir[0]
    base_path = os.path.join(ckpt_dir, "base.pt")

    # stand-in for downloading a pretrained checkpoint: rank 0 writes one, everyone loads it
    if is_main:
        torch.manual_seed(args.seed)
        torch.save(Classifier().state_dict(), base_path)
    dist.barrier()
    model = Classifier()
    model.load_state_dict(torch.load(base_path, map_location="cpu", weights_only=True))

    torch.manual_seed(args.seed + 1)  # same adapter init on every rank
    inject_lora(model, args.lora_r, args.lora_alpha)
    if is_main:
        print_trainable_parameters(model)
    model = DDP(model)

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    warmup = max(1, args.steps // 10)

    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    train_set = synthetic_task(256, args.seed)
    val_set = synthetic_task(64, args.seed + 100)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.micro_batch, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=32,
                            sampler=DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False))

    def evaluate():
        model.eval()
        correct = torch.zeros(2)
        with torch.inference_mode():
            for ids, labels in val_loader:
                correct += torch.tensor([(model(ids).argmax(-1) == labels).sum().item(), labels.numel()])
        dist.all_reduce(correct)
        model.train()
        return (correct[0] / correct[1]).item()

    step, epoch = 0, 0
    model.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for ids, labels in train_loader:
            logits = model(ids)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm=1.0)
            optimizer.step()
            scheduler.step()
            step += 1

            logged = loss.detach().clone()
            dist.all_reduce(logged, op=dist.ReduceOp.AVG)
            if is_main:
                print(f"step {step}/{args.steps} loss {logged.item():.4f} grad_norm {grad_norm.item():.3f} "
                      f"lr {scheduler.get_last_lr()[0]:.2e}", flush=True)
            if step % args.eval_every == 0 or step == args.steps:
                acc = evaluate()
                if is_main:
                    print(f"  eval accuracy {acc:.3f}", flush=True)
            if step == args.steps:
                break
        epoch += 1

    if is_main:
        adapter_state = {k: v for k, v in model.module.state_dict().items() if "lora_" in k or k.startswith("score.")}
        torch.save(adapter_state, os.path.join(ckpt_dir, "adapter_model.pt"))
        print(f"saved {len(adapter_state)} adapter tensors to {ckpt_dir}")
    dist.barrier()
    if is_main:
        for name in os.listdir(ckpt_dir):
            os.remove(os.path.join(ckpt_dir, name))
        os.rmdir(ckpt_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
