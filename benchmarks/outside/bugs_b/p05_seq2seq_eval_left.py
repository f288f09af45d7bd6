"""P05 (class c: eval mode left on during training) -- plain loop, GRU seq2seq.

Modelled on joeynmt/joeynmt#184 "model.eval()" (after mid-epoch validation the model
stays in eval mode until the next epoch) and wkentaro/pytorch-fcn#57 / PR #56 "Return to
train mode after validation".  Validation runs after step 11; it calls model.eval() and the
loop never calls model.train() again, so steps 12..35 train with dropout disabled.
Healthy twin: calls model.train() after validation.
"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
V, H, T = 30, 64, 8
class S2S(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(V, H); s.enc = nn.GRU(H, H, batch_first=True); s.dec = nn.GRU(H, H, batch_first=True)
        s.drop = nn.Dropout(0.3); s.out = nn.Linear(H, V)
    def forward(s, src, tgt_in):
        _, h = s.enc(s.drop(s.emb(src)))
        o, _ = s.dec(s.drop(s.emb(tgt_in)), h)
        return s.out(s.drop(o))
m = S2S(); opt = torch.optim.Adam(m.parameters(), lr=3e-3)
def batch(n=32):
    src = torch.randint(2, V, (n, T)); tgt = src.flip(1)                    # reverse task
    return src, torch.cat([torch.ones(n, 1, dtype=torch.long), tgt[:, :-1]], 1), tgt
m.train()
for step in range(36):
    if step == 12 and not HEALTHY: print("ONSET step", step, "model.training=", m.training)
    src, ti, to = batch()
    loss = F.cross_entropy(m(src, ti).reshape(-1, V), to.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 11:                                   # mid-epoch validation
        m.eval()
        with torch.no_grad():
            s, a, b = batch(64); vl = F.cross_entropy(m(s, a).reshape(-1, V), b.reshape(-1))
        print("val loss", round(vl.item(), 3))
        if HEALTHY: m.train()
    if step in (11, 12, 35): print(f"step {step} training={m.training} loss={loss.item():.3f}")
