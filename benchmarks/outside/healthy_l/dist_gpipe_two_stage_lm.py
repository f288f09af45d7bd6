"""Two-stage GPipe pipeline-parallel training of a small causal Transformer LM (gloo, 2 ranks).

Modelled on: the PyTorch tutorial "Introduction to Distributed Pipeline Parallelism"
(pytorch/tutorials ``intermediate_source/pipelining_tutorial.rst``): a ``Transformer`` whose
layers live in an ``nn.ModuleDict`` so that deleting layers keeps the parameter names,
``manual_model_split`` (stage 0 keeps the embedding and the first half of the layers and sets
``norm``/``output`` to ``None``; stage 1 deletes the first half and the embedding), a
``PipelineStage`` per rank, ``ScheduleGPipe(stage, n_microbatches=4, loss_fn=tokenwise_loss_fn)``,
``schedule.step(x)`` on the first rank and ``schedule.step(target=y, losses=losses)`` on the last.
The tutorial stops at one step; here each rank adds its own AdamW, a warm-up schedule and
gradient clipping by the *global* norm (per-stage squared norms all-reduced, as torchtitan
does for pipeline parallelism), and checkpoints are written per stage.

Unusual (but intended) things about the loop:
* the two ranks own *disjoint* parameter sets, run different code paths, and never all-reduce
  gradients; only the last rank ever sees a loss value;
* half of the declared modules are deleted / set to ``None`` on each rank;
* dropout uses a per-rank RNG seed; data are generated identically on both ranks (rank 0 needs
  the inputs, rank 1 the targets);
* warm-up from lr 0; a mid-run evaluation runs a hand-written forward pipeline with
  ``dist.send``/``dist.recv``; at the end rank 0 merges both per-stage checkpoints into one full
  model and re-computes the evaluation loss to confirm the shards fit together.
"""
import copy
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

torch.set_num_threads(1)


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    vocab_size: int = 48
    seq_len: int = 32


class Transformer(nn.Module):
    def __init__(self, model_args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        self.pos_embeddings = nn.Parameter(torch.randn(model_args.seq_len, model_args.dim) * 0.02)
        # ModuleDict: deleting layers keeps the remaining names, so checkpoints load correctly
        self.layers = torch.nn.ModuleDict()
        for layer_id in range(model_args.n_layers):
            self.layers[str(layer_id)] = nn.TransformerEncoderLayer(
                model_args.dim, model_args.n_heads, dim_feedforward=4 * model_args.dim, dropout=0.1,
                batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(model_args.dim)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size)
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(model_args.seq_len),
                             persistent=False)

    def forward(self, tokens: torch.Tensor):
        h = self.tok_embeddings(tokens) + self.pos_embeddings if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, src_mask=self.causal_mask, is_causal=True)
        h = self.norm(h) if self.norm else h
        return self.output(h).clone() if self.output else h


def manual_model_split(model, stage_index, num_stages):
    if stage_index == 0:
        for i in range(2, 4):
            del model.layers[str(i)]
        model.norm = None
        model.output = None
    elif stage_index == 1:
        for i in range(2):
            del model.layers[str(i)]
        model.tok_embeddings = None
        model.pos_embeddings = None
    return PipelineStage(model, stage_index, num_stages, torch.device("cpu"))


def tokenwise_loss_fn(outputs, targets):
    return nn.functional.cross_entropy(outputs.reshape(-1, outputs.size(-1)), targets.reshape(-1))


def get_batch(gen, args, batch_size=16):
    """Noisy arithmetic progressions mod V: next token is predictable from the previous two."""
    start = torch.randint(0, args.vocab_size, (batch_size, 1), generator=gen)
    step = torch.randint(1, 5, (batch_size, 1), generator=gen)
    seq = (start + step * torch.arange(args.seq_len + 1)) % args.vocab_size
    noise = torch.rand(seq.shape, generator=gen) < 0.05
    seq = torch.where(noise, torch.randint(0, args.vocab_size, seq.shape, generator=gen), seq)
    return seq[:, :-1], seq[:, 1:]


@torch.no_grad()
def pipeline_eval(stage_model, rank, x, y, args):
    stage_model.eval()
    loss = None
    if rank == 0:
        dist.send(stage_model(x).contiguous(), dst=1)
    else:
        h = torch.empty(x.shape[0], args.seq_len, args.dim)
        dist.recv(h, src=0)
        loss = tokenwise_loss_fn(stage_model(h), y).item()
    stage_model.train()
    return loss


def clip_global_grad_norm_(params, max_norm):
    local_sq = torch.stack([p.grad.pow(2).sum() for p in params if p.grad is not None]).sum()
    dist.all_reduce(local_sq)  # sum over pipeline stages
    total_norm = local_sq.sqrt()
    clip_coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(clip_coef)
    return total_norm


def main():
    dist.init_process_group("gloo")
    rank, num_stages = dist.get_rank(), dist.get_world_size()
    args = ModelArgs()
    torch.manual_seed(0)                       # identical full-model init on both ranks
    full_model = Transformer(args)
    stage_model = copy.deepcopy(full_model)
    stage = manual_model_split(stage_model, rank, num_stages)
    del full_model
    torch.manual_seed(100 + rank)              # per-rank dropout stream

    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=tokenwise_loss_fn)
    params = [p for p in stage_model.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    warmup, total_steps = 5, 40
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / warmup))

    data_gen = torch.Generator().manual_seed(1234)   # same data stream on both ranks
    eval_x, eval_y = get_batch(torch.Generator().manual_seed(999), args, batch_size=32)
    n_local = sum(p.numel() for p in params)
    owned = sorted({".".join(n.split(".")[:2]) if n.startswith("layers") else n.split(".")[0]
                    for n, _ in stage_model.named_parameters()})
    print(f"[rank {rank}] stage {rank} holds {n_local} parameters: {owned}")

    for step in range(total_steps):
        x, y = get_batch(data_gen, args)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            losses = []
            schedule.step(target=y, losses=losses)
        norm = clip_global_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        if rank == num_stages - 1 and step % 5 == 0:
            print(f"step {step:2d} loss {torch.stack(losses).mean().item():.4f} global grad-norm {norm.item():.3f} "
                  f"lr {scheduler.get_last_lr()[0]:.2e}")
        if (step + 1) % 20 == 0:
            ev = pipeline_eval(stage_model, rank, eval_x, eval_y, args)
            if ev is not None:
                print(f"[eval @ step {step + 1}] loss {ev:.4f}")

    # per-stage checkpoints, then rank 0 stitches them together
    path = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    torch.save(stage_model.state_dict(), os.path.join(path[0], f"stage{rank}.pt"))
    final_eval = pipeline_eval(stage_model, rank, eval_x, eval_y, args)
    final_eval = [final_eval]
    dist.broadcast_object_list(final_eval, src=num_stages - 1)
    dist.barrier()
    if rank == 0:
        merged = Transformer(args)
        state = {}
        for s in range(num_stages):
            state.update(torch.load(os.path.join(path[0], f"stage{s}.pt")))
        merged.load_state_dict(state, strict=True)  # every key present exactly once
        merged.eval()
        with torch.no_grad():
            full_loss = tokenwise_loss_fn(merged(eval_x), eval_y).item()
        print(f"merged checkpoint eval loss {full_loss:.4f} vs pipeline {final_eval[0]:.4f}")
        assert abs(full_loss - final_eval[0]) < 1e-4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
