"""p02 - class 1: a pure-bf16 Transformer LM silently becomes fp32 mid-run (module cast in place).
Modelled on: open-mmlab/mmsegmentation #283 "how to save fp32 model while training with fp16?" and
pytorch/torchtitan PR #4166 (export-dtype conversion must not change the live training model); the
PyTorch docs note that Module.float() "modifies the module in-place".  Bug: the checkpoint at step 12
does torch.save(model.float().state_dict()), so the live model (and every later step) runs in fp32.
Onset: optimizer step 12 (0-based).  `--healthy` converts a copy of the state dict instead."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
V, D, T = 64, 64, 16
class LM(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(V, D); s.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        layer = nn.TransformerEncoderLayer(D, 4, 128, dropout=0.1, batch_first=True)
        s.enc = nn.TransformerEncoder(layer, 2); s.head = nn.Linear(D, V)
    def forward(s, x):
        m = nn.Transformer.generate_square_subsequent_mask(x.size(1)).to(s.pos.dtype)
        return s.head(s.enc(s.emb(x) + s.pos[: x.size(1)], mask=m))
model = LM().to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # (AdamW would raise on the dtype change; SGD+momentum is silent)
g = torch.Generator().manual_seed(1)
for step in range(36):
    x = torch.randint(0, V, (16, T + 1), generator=g); x[:, 1::2] = x[:, 0::2][:, : x[:, 1::2].size(1)]
    logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 11:  # checkpoint after 12 steps, saved in fp32
        path = "p02_ckpt.pt"
        if healthy:
            torch.save({k: v.float() for k, v in model.state_dict().items()}, path)
        else:
            torch.save(model.float().state_dict(), path)
            print("ONSET: model is fp32 from optimizer step 12 (0-based)")
print("final loss", loss.item(), next(model.parameters()).dtype)
