"""P04 (class b: optimizer built over a stale / deep-copied model) -- GAN, two optimizers.

Modelled on skorch-dev/skorch#317 "module weights don't update after copy.deepcopy" and
pytorch/pytorch#14467 "Optimizer warning when parameters 'change'" (the optimizer keeps
pointing at the old Parameter objects after the model object is replaced).  At step 12
the training script swaps in a deep copy of the discriminator (a "restart D from the
snapshot" trick) but keeps the old optD, which still holds the previous D's
Parameters: from then on optD steps tensors that are no longer in the model, and the
live discriminator never changes.  Healthy twin: rebuilds optD over the new D and loads
its state.
"""
import sys, copy, torch, torch.nn as nn, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
optG = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
optD = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
def real(n): a = torch.rand(n) * 6.28; return torch.stack([a.cos(), a.sin()], 1) * 2 + 0.05 * torch.randn(n, 2)
for step in range(36):
    if step == 12:
        snap = copy.deepcopy(D)            # "restart D from snapshot"
        D = snap
        if HEALTHY:
            st = optD.state_dict(); optD = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999)); optD.load_state_dict(st)
        else:
            print("ONSET step", step)
    w0 = D[0].weight.detach().clone()
    z = torch.randn(64, 8); xr = real(64); xf = G(z)
    lossD = F.binary_cross_entropy_with_logits(D(xr), torch.ones(64, 1)) + F.binary_cross_entropy_with_logits(D(xf.detach()), torch.zeros(64, 1))
    optD.zero_grad(); lossD.backward(); optD.step()
    lossG = F.binary_cross_entropy_with_logits(D(G(z)), torch.ones(64, 1))
    optG.zero_grad(); lossG.backward(); optG.step()
    if step in (11, 12, 35): print(f"step {step} |dD.w|={(D[0].weight - w0).norm():.2e} lossD={lossD.item():.3f} lossG={lossG.item():.3f}")
