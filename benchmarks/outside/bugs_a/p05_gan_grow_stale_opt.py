"""p05 - class 2: GAN (two models, two Adam optimizers); the generator is grown (re-created with an
extra layer, old weights copied in) at iteration 12 but optimizerG still holds the old generator's
parameters, so the live generator is never updated again.  Modelled on: NVIDIA/apex #292 "Adding new
parameter groups to an optimizer" (growing model: the optimizer must be told about new params at each
growth), online-ml/deep-river #169 and LaurentMazare/ocaml-torch #36 (optimizer built over other
tensors than the ones trained -> step does nothing).  Onset: iteration 12 (0-based; each iteration =
one D step + one G step).  `--healthy` rebuilds optimizerG after growing."""
import sys, math, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
Z = 8
class G(nn.Module):
    def __init__(s, extra=False):
        super().__init__()
        s.body = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        s.extra = nn.Sequential(nn.Linear(64, 64), nn.ReLU()) if extra else None
        s.out = nn.Linear(64, 2)
    def forward(s, z):
        h = s.body(z)
        if s.extra is not None: h = h + s.extra(h)
        return s.out(h)
netG, netD = G(), nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
g = torch.Generator().manual_seed(1)
def real(n=64):
    k = torch.randint(0, 8, (n,), generator=g).float() * (2 * math.pi / 8)
    return torch.stack([2 * torch.cos(k), 2 * torch.sin(k)], 1) + 0.05 * torch.randn(n, 2, generator=g)
ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
for it in range(36):
    if it == 12:   # progressive growth
        bigger = G(extra=True); bigger.load_state_dict(netG.state_dict(), strict=False)
        nn.init.zeros_(bigger.extra[0].weight); nn.init.zeros_(bigger.extra[0].bias)
        netG = bigger
        if healthy: optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
        else: print("ONSET: optimizerG holds stale params from iteration 12 (0-based)")
    # D step
    fake = netG(torch.randn(64, Z, generator=g))
    lossD = F.binary_cross_entropy_with_logits(netD(real()), ones) + F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros)
    optD.zero_grad(); lossD.backward(); optD.step()
    # G step
    lossG = F.binary_cross_entropy_with_logits(netD(fake), ones)
    optG.zero_grad(); lossG.backward(); optG.step()
print("final", lossD.item(), lossG.item())
