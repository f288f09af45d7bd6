"""Character-level GPT trained nanoGPT-style: gradient accumulation, bf16 autocast on CPU, cosine lr.

Modelled on: karpathy/nanoGPT, train.py (https://github.com/karpathy/nanoGPT); the model is
in nanogpt_model.py beside it, as nanoGPT's is in model.py, and is imported the same way
(the script's own directory is first on ``sys.path`` when it is run as a script).
Habits reproduced: module-level config globals overridden from the command line, train.bin/
val.bin token files read back with np.memmap in get_batch(), get_lr() warmup + cosine
written into every param_group each iteration, estimate_loss() decorated with
@torch.no_grad() switching model.eval()/model.train(), micro-steps under
torch.autocast(bfloat16) with the loss divided by the accumulation count and the next
batch prefetched, a disabled GradScaler still wrapping backward/unscale_/step/update,
clip_grad_norm_, zero_grad(set_to_none=True), and checkpoint dicts saved on val improvement.
"""
import argparse
import math
import os
import shutil
import tempfile
import time
from contextlib import nullcontext

import numpy as np
import torch

from nanogpt_model import GPT, GPTConfig


# ----------------------------------------------------------------------------- config
# default config values, tiny enough for a CPU; overridden from the command line below
out_dir = "out-shakespeare-char"
eval_interval = 4
log_interval = 1
eval_iters = 2
always_save_checkpoint = False
dataset = "shakespeare_char"
gradient_accumulation_steps = 4
batch_size = 4
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.1
bias = False
learning_rate = 1e-3
max_iters = 30
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 30
min_lr = 1e-4
device = "cpu"
dtype = "bfloat16"
seed = 1337

parser = argparse.ArgumentParser(description="tiny nanoGPT-style training run on synthetic characters")
parser.add_argument("--steps", type=int, default=max_iters, help="optimizer steps (iterations) to run")
parser.add_argument("--seed", type=int, default=seed)
parser.add_argument("--gradient_accumulation_steps", type=int, default=gradient_accumulation_steps)
parser.add_argument("--eval_interval", type=int, default=eval_interval)
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=dtype)
parser.add_argument("--checkpoint_blocks", action="store_true", help="activation checkpointing of every block")
cli = parser.parse_args()
# nanoGPT runs iterations 0..max_iters inclusive, so N steps means max_iters = N - 1
max_iters = cli.steps - 1
lr_decay_iters = max(cli.steps, warmup_iters + 1)
seed = cli.seed
gradient_accumulation_steps = cli.gradient_accumulation_steps
eval_interval = cli.eval_interval
dtype = cli.dtype
checkpoint_blocks = cli.checkpoint_blocks
config = {k: v for k, v in globals().items()
          if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
# -----------------------------------------------------------------------------

master_process = True
seed_offset = 0
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")

out_dir = tempfile.mkdtemp(prefix=out_dir + "-")
torch.manual_seed(seed + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if dtype == "float32" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# prepare.py stand-in: write a character stream with some repetition to train.bin / val.bin
data_dir = os.path.join(out_dir, "data", dataset)
os.makedirs(data_dir)
rng = np.random.default_rng(seed)
meta_vocab_size = 65
words = [rng.integers(1, meta_vocab_size, size=rng.integers(2, 7)) for _ in range(40)]
stream = np.concatenate([np.append(words[i], 0) for i in rng.integers(0, len(words), size=3000)])
n = len(stream)
stream[:int(n * 0.9)].astype(np.uint16).tofile(os.path.join(data_dir, "train.bin"))
stream[int(n * 0.9):].astype(np.uint16).tofile(os.path.join(data_dir, "val.bin"))


def get_batch(split):
    # recreate np.memmap every batch to avoid a memory leak, as the original notes
    if split == "train":
        data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
    else:
        data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


iter_num = 0
best_val_loss = 1e9

model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                  bias=bias, vocab_size=meta_vocab_size, dropout=dropout, checkpoint_blocks=checkpoint_blocks)
print("Initializing a new model from scratch")
gptconf = GPTConfig(**model_args)
model = GPT(gptconf)
model.to(device)

# only does anything for float16; kept so the loop reads the same for every dtype
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))

optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


# training loop
X, Y = get_batch("train")  # fetch the very first batch
t0 = time.time()
local_iter_num = 0
raw_model = model
while True:

    # determine and set the learning rate for this iteration
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    # evaluate the loss on train/val sets and write checkpoints
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": config,
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        # immediately async prefetch next batch while model is doing the forward pass
        X, Y = get_batch("train")
        # backward pass, with gradient scaling if training in fp16
        scaler.scale(loss).backward()
    # clip the gradient
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    # step the optimizer and scaler if training in fp16
    scaler.step(optimizer)
    scaler.update()
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)

    # timing and logging
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        # get loss as float. note: this is a CPU-GPU sync point
        # scale up to undo the division above, approximating the true total loss (exact would have been a sum)
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, lr {lr:.2e}")
    iter_num += 1
    local_iter_num += 1

    # termination conditions
    if iter_num > max_iters:
        break

# resume path of train.py: reload the best checkpoint into a fresh model and check it evaluates
ckpt_path = os.path.join(out_dir, "ckpt.pt")
if os.path.exists(ckpt_path):
    checkpoint = torch.load(ckpt_path, map_location=device)
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k, v in list(state_dict.items()):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    losses = estimate_loss()
    print(f"reloaded iter {checkpoint['iter_num']}: val loss {losses['val']:.4f}")
shutil.rmtree(out_dir)
