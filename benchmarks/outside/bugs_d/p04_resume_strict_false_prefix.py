"""P04 (class: checkpoint-restore mistake -- weights silently not restored, model re-initialised) -- plain loop.

Modelled on pytorch/examples#1029 "nn.module load_state_dict strict=False can silently load
a corrupted model": the checkpoint was written from a wrapper module (a Lightning-style
module holding the network as `.model`), so every key carries a `model.` prefix;
loading it into the bare network with `strict=False` matches *no* key, raises nothing,
and the network keeps its fresh initialisation.  (The same trap with the `module.`
prefix of DataParallel/DDP checkpoints is pytorch/pytorch#3805.)

Here a small causal transformer LM is trained on a synthetic Markov-chain language.  The
job is pre-empted after 12 optimizer steps (checkpoint: wrapper state_dict, optimizer,
scheduler, step, data RNG) and resumed in the same process, as a restarted job would:
re-seed, rebuild everything, load the checkpoint.  Optimizer/scheduler/data state are
restored correctly, but the weights are not, so from step 12 on training continues from
the step-0 initialisation with Adam moments that belong to other weights.
Healthy twin: the `model.` prefix is stripped and the state dict is loaded strictly.
"""
import sys, math, time
import torch, torch.nn as nn, torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)

VOCAB, CTX, D, LAYERS, HEADS = 48, 32, 64, 2, 4
TOTAL_STEPS, PREEMPT_AT, WARMUP = 36, 12, 4
BATCH, LR = 32, 3e-3
CKPT = "bugsd_p04_last.ckpt"

# fixed synthetic "language": sparse first-order Markov chain
_g = torch.Generator().manual_seed(2024)
_logits = torch.randn(VOCAB, VOCAB, generator=_g) * 3.0
TRANS = torch.softmax(_logits, -1)


def sample_batch(gen, n=BATCH):
    seq = torch.empty(n, CTX + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (n,), generator=gen)
    for t in range(CTX):
        seq[:, t + 1] = torch.multinomial(TRANS[seq[:, t]], 1, generator=gen).squeeze(1)
    return seq[:, :-1], seq[:, 1:]


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((CTX, CTX), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        x = self.blocks(x, mask=self.mask[: idx.size(1), : idx.size(1)], is_causal=True)
        return self.head(self.ln_f(x))


class LitLM(nn.Module):
    """Training wrapper (what the training framework checkpoints): holds net + loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def lr_lambda(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL_STEPS - WARMUP)))


def build():
    torch.manual_seed(0)                       # a restarted job seeds exactly like the first one
    net = TinyGPT()
    lit = LitLM(net)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    return net, lit, opt, sched


@torch.no_grad()
def evaluate(lit):
    lit.eval()
    g = torch.Generator().manual_seed(777)
    losses = [lit(*sample_batch(g, 64)).item() for _ in range(2)]
    lit.train()
    return sum(losses) / len(losses)


def run(start_step, stop_step, resume):
    net, lit, opt, sched = build()
    data_gen = torch.Generator().manual_seed(11)
    if resume:
        ckpt = torch.load(CKPT, weights_only=False)
        if HEALTHY:
            sd = {k[len("model."):] if k.startswith("model.") else k: v for k, v in ckpt["state_dict"].items()}
            net.load_state_dict(sd, strict=True)
        else:
            net.load_state_dict(ckpt["state_dict"], strict=False)   # BUG: keys are "model.*" -> nothing loaded
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["lr_scheduler"])
        data_gen.set_state(ckpt["data_rng"])
        start_step = ckpt["global_step"]
        print(f"resumed from {CKPT} at step {start_step} (val loss at save: {ckpt['val_loss']:.4f})")
    lit.train()
    for step in range(start_step, stop_step):
        if resume and step == start_step and not HEALTHY:
            print("ONSET step", step)
        x, y = sample_batch(data_gen)
        loss = lit(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 3 == 0:
            print(f"step {step:2d} loss {loss.item():.4f} gnorm {gn.item():.3f} lr {sched.get_last_lr()[0]:.2e}")
    val = evaluate(lit)
    print(f"  [val] after step {stop_step - 1}: loss {val:.4f} (uniform = {math.log(VOCAB):.4f})")
    if stop_step < TOTAL_STEPS:              # pre-emption: save and exit
        torch.save({"state_dict": lit.state_dict(), "optimizer": opt.state_dict(),
                    "lr_scheduler": sched.state_dict(), "global_step": stop_step,
                    "data_rng": data_gen.get_state(), "val_loss": val}, CKPT)
        print(f"  saved {CKPT} (job pre-empted)")


if __name__ == "__main__":
    t0 = time.time()
    run(0, PREEMPT_AT, resume=False)          # first job allocation
    run(0, TOTAL_STEPS, resume=True)          # restarted job
    print(f"done in {time.time() - t0:.1f}s")
