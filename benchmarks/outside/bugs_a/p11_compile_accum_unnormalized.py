"""p11 - class 6/7: torch.compile'd MLP regressor; at step 12 the job switches from 1 x 64 samples to
4 x 16-sample micro-batches with gradient accumulation (to save memory) but does not divide the loss by
the accumulation count: gradients become 4x larger (wrong loss reduction across micro-batches).
Modelled on: huggingface/transformers #37766 "As gradient_accumulation_steps increases, the loss also
increases", agokrani/distillKitPlus #5 "Normalize Loss by Gradient Accumulation Steps Absent" and
karpathy/nanoGPT #206.  Onset: optimizer step 12 (0-based).  `--healthy` divides by accum."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 1))
cmodel = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
g = torch.Generator().manual_seed(1)
W = torch.randn(32, 1, generator=g)
for step in range(36):
    accum = 1 if step < 12 else 4
    if step == 12 and not healthy: print("ONSET: un-normalised accumulation from optimizer step 12 (0-based)")
    for m in range(accum):
        x = torch.randn(64 // accum, 32, generator=g); y = torch.sin(x @ W)
        loss = F.mse_loss(cmodel(x), y)
        (loss / accum if healthy else loss).backward()
    opt.step(); opt.zero_grad()
print("final loss", loss.item())
