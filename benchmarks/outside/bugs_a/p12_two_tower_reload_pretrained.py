"""p12 - class 4: CLIP-style two-tower contrastive model with one optimizer per tower; the "load pretrained
text tower" code sits inside the epoch loop, so at the start of every epoch after the first the text
tower is reset to its initial checkpoint.  Modelled on: flairNLP/flair #1899 "After every batch weights
get initialized from beginning?" and havakv/pycox #28 (model state handling in the wrong loop).
3 epochs x 12 steps.  Onset: optimizer step 12 (0-based; start of epoch 2).  `--healthy` loads once."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
img = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 32))
txt = nn.Sequential(nn.Embedding(50, 32), nn.Flatten(), nn.Linear(6 * 32, 64), nn.ReLU(), nn.Linear(64, 32))
CK = "p12_text_pretrained.pt"
torch.save(txt.state_dict(), CK)         # stands in for a pretrained text encoder
opt_i = torch.optim.Adam(img.parameters(), lr=1e-3)
opt_t = torch.optim.AdamW(txt.parameters(), lr=1e-3, weight_decay=0.01)
temp = 0.1
g = torch.Generator().manual_seed(1)
P = torch.randn(6 * 50, 48, generator=g) * 0.3
def batch(n=32):
    toks = torch.randint(0, 50, (n, 6), generator=g)
    feats = F.one_hot(toks, 50).float().reshape(n, -1) @ P + 0.05 * torch.randn(n, 48, generator=g)
    return feats, toks
loaded = False
for epoch in range(3):
    if healthy and not loaded or not healthy:
        txt.load_state_dict(torch.load(CK))  # BUG (buggy variant): inside the epoch loop
        loaded = True
        if not healthy and epoch == 1: print("ONSET: text tower reset to its initial weights at optimizer step 12 (0-based)")
    for i in range(12):
        f, t = batch()
        zi = F.normalize(img(f), dim=-1); zt = F.normalize(txt(t), dim=-1)
        logits = zi @ zt.t() / temp; lab = torch.arange(len(f))
        loss = (F.cross_entropy(logits, lab) + F.cross_entropy(logits.t(), lab)) / 2
        opt_i.zero_grad(); opt_t.zero_grad(); loss.backward(); opt_i.step(); opt_t.step()
    print("epoch", epoch, "loss", loss.item())
