"""Multimodal dialogue response selection (text context + image features -> response id).

A GRU encodes the dialogue context, an MLP projects pre-extracted image features, and a fused
representation scores a fixed set of response templates.  Dropout regularises both encoders.
Validation runs every `eval_every` optimizer steps inside the training loop, in the style of
the MMD (multimodal dialogue) training script.

Modelled on: shubhamagarwal92/mmd issue #14 "model.eval() in train.py" — `evaluate()` calls
`model.eval()` to disable dropout, but `model.train()` is only called once before the epoch
loop, so after the first validation pass the rest of training runs with dropout disabled (the
reporter's fix: call `model.train()` after `evaluate()` returns).

Unusual about the loop: validation is interleaved by step count, not at epoch ends, so the
first `eval_every` steps are trained correctly and everything after the first validation pass
is not.
--healthy: `model.train()` is called again right after each validation pass.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

VOCAB, CTX_LEN, IMG_DIM, N_RESP = 60, 12, 64, 16


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, IMG_DIM, generator=torch.Generator().manual_seed(7))
    cluster = torch.randint(0, 4, (n,), generator=g)
    intent = torch.randint(0, 4, (n,), generator=g)
    img = centers[cluster] + 1.5 * torch.randn(n, IMG_DIM, generator=g)
    ctx = torch.randint(8, VOCAB, (n, CTX_LEN), generator=g)
    pos = torch.randint(0, CTX_LEN, (n,), generator=g)
    ctx[torch.arange(n), pos] = intent + 1            # intent keyword somewhere in the context
    return ctx, img, cluster * 4 + intent


class MultimodalEncoder(nn.Module):
    def __init__(self, hidden=64, p=0.3):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.gru = nn.GRU(32, hidden, batch_first=True)
        self.txt_drop = nn.Dropout(p)
        self.img = nn.Sequential(nn.Linear(IMG_DIM, hidden), nn.Tanh(), nn.Dropout(p))
        self.fuse = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(p))
        self.out = nn.Linear(hidden, N_RESP)

    def forward(self, ctx, img):
        _, h = self.gru(self.emb(ctx))
        z = torch.cat([self.txt_drop(h[-1]), self.img(img)], dim=-1)
        return self.out(self.fuse(z))


def evaluate(model, data, bs=256):
    model.eval()
    ctx, img, y = data
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), bs):
            logits = model(ctx[i:i + bs], img[i:i + bs])
            total_loss += F.cross_entropy(logits, y[i:i + bs], reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + bs]).sum().item()
    return total_loss / len(y), correct / len(y)


def main():
    torch.manual_seed(0)
    train, val = make_split(3000, 1), make_split(500, 2)
    model = MultimodalEncoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    bs, eval_every, n_epochs = 64, 10, 1
    steps_per_epoch = len(train[2]) // bs

    step, no_dropout_steps = 0, 0
    model.train()
    for epoch in range(n_epochs):
        perm = torch.randperm(len(train[2]), generator=torch.Generator().manual_seed(epoch))
        for b in range(steps_per_epoch):
            idx = perm[b * bs:(b + 1) * bs]
            ctx, img, y = train[0][idx], train[1][idx], train[2][idx]
            no_dropout_steps += int(not model.training)
            logits = model(ctx, img)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            print(f"step {step:3d} loss {loss.item():.4f}")
            step += 1
            if step % eval_every == 0:
                val_loss, val_acc = evaluate(model, val)
                print(f"  [val] step {step} loss {val_loss:.4f} acc {val_acc:.3f}")
                if HEALTHY:
                    model.train()
                elif step == eval_every:
                    print(f"ONSET step {step}")

    print(f"EVIDENCE training_flag_at_end={model.training} steps_with_dropout_off={no_dropout_steps}/{step} "
          f"final_val_loss={val_loss:.4f}")


if __name__ == "__main__":
    main()
