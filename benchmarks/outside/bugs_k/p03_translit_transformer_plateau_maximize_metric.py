"""Character-level transliteration with a small Transformer encoder-decoder, fairseq-style loop.

Source words in one "script" are mapped to a target script (a fixed substitution plus a few
context-dependent digraph rules, output reversed, as in right-to-left scripts).  The loop mirrors
fairseq's trainer options: ``--validate-interval-updates``, ``--best-checkpoint-metric acc
--maximize-best-checkpoint-metric`` and ``--lr-scheduler reduce_lr_on_plateau`` with
``--lr-shrink`` / ``--lr-patience``; the scheduler wrapper is stepped with the value of the
best-checkpoint metric after every validation.

Modelled on: facebookresearch/fairseq#2205 "ReduceLROnPlateau does not support
`maximize-best-checkpoint-metric`": fairseq's ``reduce_lr_on_plateau`` wrapper built
``torch.optim.lr_scheduler.ReduceLROnPlateau`` with the default ``mode='min'`` even when the
checkpoint metric is to be maximised (accuracy/BLEU), "so it is reducing lr as the training
progresses" although the metric keeps improving.  The fix chooses ``mode='max'`` when
``--maximize-best-checkpoint-metric`` is set.

Unusual about the loop: mid-epoch validation every 5 updates drives the scheduler; label smoothing;
gradient clipping (clip-norm 1.0).  The LR cut happens at a data-dependent validation, detected at
run time by comparing against a correctly configured scheduler fed the same metric values.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
PAD, BOS, EOS = 0, 1, 2
SRC_CHARS = list("abcdefghijklmnop")
TGT_VOCAB = 3 + 20


def transliterate(word):
    out, i = [], 0
    while i < len(word):
        if word[i:i + 2] in ("ch", "ph"):              # digraph rules
            out.append(19 if word[i] == "c" else 18)
            i += 2
            continue
        out.append(SRC_CHARS.index(word[i]))
        i += 1
    return [3 + (c * 7) % 17 for c in reversed(out)]


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        L = int(torch.randint(4, 10, (1,), generator=g))
        w = "".join(SRC_CHARS[int(i)] for i in torch.randint(0, len(SRC_CHARS), (L,), generator=g))
        pairs.append(([3 + SRC_CHARS.index(ch) for ch in w], transliterate(w)))
    return pairs


def collate(pairs):
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs) + 1
    src = torch.full((len(pairs), S), PAD)
    prev = torch.full((len(pairs), T), PAD)
    tgt = torch.full((len(pairs), T), PAD)
    for i, (s, t) in enumerate(pairs):
        src[i, :len(s)] = torch.tensor(s)
        prev[i, :len(t) + 1] = torch.tensor([BOS] + t)
        tgt[i, :len(t) + 1] = torch.tensor(t + [EOS])
    return src, prev, tgt


class TransformerModel(nn.Module):
    def __init__(self, d=64, heads=4, layers=2, max_len=16):
        super().__init__()
        self.src_emb = nn.Embedding(3 + len(SRC_CHARS), d, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(TGT_VOCAB, d, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(max_len, d) * 0.02)
        self.tf = nn.Transformer(d, heads, layers, layers, dim_feedforward=128, dropout=0.1,
                                 batch_first=True)
        self.out = nn.Linear(d, TGT_VOCAB)

    def forward(self, src, prev):
        T = prev.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        h = self.tf(self.src_emb(src) + self.pos[:src.size(1)], self.tgt_emb(prev) + self.pos[:T],
                    tgt_mask=causal, src_key_padding_mask=src.eq(PAD),
                    tgt_key_padding_mask=prev.eq(PAD), memory_key_padding_mask=src.eq(PAD))
        return self.out(h)


class ReduceLROnPlateauSchedule:
    """fairseq-style wrapper: ``step(epoch, val_loss)`` where val_loss is the checkpoint metric."""

    def __init__(self, args, optimizer):
        if args.healthy:  # the fix: respect --maximize-best-checkpoint-metric
            mode = "max" if args.maximize_best_checkpoint_metric else "min"
        else:             # torch's default, as in fairseq before the fix
            mode = "min"
        self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode=mode, patience=args.lr_patience, factor=args.lr_shrink,
            threshold=args.lr_threshold)

    def step(self, epoch, val_loss=None):
        if val_loss is not None:
            self.lr_scheduler.step(val_loss)
        return self.lr_scheduler.optimizer.param_groups[0]["lr"]


@torch.no_grad()
def validate(model, batch):
    model.eval()
    src, prev, tgt = batch
    logits = model(src, prev)
    mask = tgt.ne(PAD)
    acc = ((logits.argmax(-1) == tgt) & mask).sum().item() / mask.sum().item()
    loss = F.cross_entropy(logits[mask], tgt[mask]).item()
    model.train()
    return {"loss": loss, "acc": 100.0 * acc}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-shrink", type=float, default=0.5)
    ap.add_argument("--lr-patience", type=int, default=1)
    ap.add_argument("--lr-threshold", type=float, default=1e-4)
    ap.add_argument("--max-update", type=int, default=45)
    ap.add_argument("--validate-interval-updates", type=int, default=5)
    ap.add_argument("--best-checkpoint-metric", default="acc")
    ap.add_argument("--maximize-best-checkpoint-metric", action="store_true", default=True)
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    train, valid = make_data(2048, 1), collate(make_data(256, 2))
    model = TransformerModel()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    sched = ReduceLROnPlateauSchedule(args, opt)
    ref = None
    if not args.healthy:  # instrumentation only: what a correctly configured scheduler would do
        ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.lr)
        ref = torch.optim.lr_scheduler.ReduceLROnPlateau(ref_opt, mode="max", patience=args.lr_patience,
                                                         factor=args.lr_shrink, threshold=args.lr_threshold)
    g = torch.Generator().manual_seed(3)
    num_updates, best, onset_printed = 0, None, False
    while num_updates < args.max_update:
        order = torch.randperm(len(train), generator=g).tolist()
        for i in range(0, len(order) - 31, 32):
            src, prev, tgt = collate([train[j] for j in order[i:i + 32]])
            logits = model(src, prev)
            loss = F.cross_entropy(logits.reshape(-1, TGT_VOCAB), tgt.reshape(-1),
                                   ignore_index=PAD, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            gnorm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            num_updates += 1
            if num_updates % args.validate_interval_updates == 0:
                stats = validate(model, valid)
                metric = stats[args.best_checkpoint_metric]
                best = metric if best is None else max(best, metric)
                lr = sched.step(num_updates // 45, metric)
                print(f"| valid on update {num_updates}: loss {stats['loss']:.3f} acc {metric:.2f} "
                      f"best_acc {best:.2f} lr {lr:.2e} gnorm {gnorm:.2f}", flush=True)
                if ref is not None:
                    ref.step(metric)
                    if not onset_printed and not math.isclose(lr, ref.optimizer.param_groups[0]["lr"]):
                        print(f"ONSET step {num_updates}", flush=True)
                        onset_printed = True
            if num_updates >= args.max_update:
                break
    final_lr = opt.param_groups[0]["lr"]
    print(f"EVIDENCE scheduler mode={sched.lr_scheduler.mode}; final lr {final_lr:.2e} "
          f"(initial {args.lr:.1e}, {round(math.log(args.lr / final_lr, 2))} halvings) while "
          f"validation acc rose to {best:.2f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
