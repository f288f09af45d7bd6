"""p06 - class 3: seq2seq GRU encoder-decoder (teacher forcing, dropout); a mid-epoch validation leaves
the model in eval mode, and model.train() is only called at the start of each epoch.
Modelled on: joeynmt/joeynmt #184 "After validate on the dev data and come back to train, the model is
still on the model.eval() state", pfnet/pytorch-pfn-extras #688 and wkentaro/pytorch-fcn PR #56
"Return to train mode after validation".  Onset: optimizer step 12 (0-based; validation runs before it).
One epoch of 36 steps, validation every 12 steps.  `--healthy` calls model.train() after validating."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
V, H, T, BOS = 20, 64, 8, 0
class Seq2Seq(nn.Module):
    def __init__(s):
        super().__init__()
        s.src_emb = nn.Embedding(V, H); s.tgt_emb = nn.Embedding(V, H)
        s.enc = nn.GRU(H, H, batch_first=True); s.dec = nn.GRU(H, H, batch_first=True)
        s.drop = nn.Dropout(0.3); s.out = nn.Linear(H, V)
    def forward(s, src, tgt_in):
        _, h = s.enc(s.drop(s.src_emb(src)))
        o, _ = s.dec(s.drop(s.tgt_emb(tgt_in)), h)
        return s.out(s.drop(o))
model = Seq2Seq()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
g = torch.Generator().manual_seed(1)
def batch(n=32):
    src = torch.randint(1, V, (n, T), generator=g); tgt = src.flip(1)   # reversal task
    tgt_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], 1)
    return src, tgt_in, tgt
def validate():
    model.eval()
    with torch.no_grad():
        src, tgt_in, tgt = batch(64)
        return F.cross_entropy(model(src, tgt_in).reshape(-1, V), tgt.reshape(-1)).item()
for epoch in range(1):
    model.train()
    for step in range(36):
        if step > 0 and step % 12 == 0:
            print("valid loss", validate())
            if healthy: model.train()
            elif step == 12: print("ONSET: eval mode during training from optimizer step 12 (0-based)")
        src, tgt_in, tgt = batch()
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, V), tgt.reshape(-1))
        opt.zero_grad(); loss.backward(); opt.step()
print("final loss", loss.item())
