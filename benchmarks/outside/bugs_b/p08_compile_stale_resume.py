"""P08 (class d: a mid-run load_state_dict restores stale weights) -- torch.compile, plain loop.

Modelled on NVIDIA/physicsnemo#2012 "Checkpoint loading can mix model weights and
training state from different epochs": the loader picks the newest *surviving* weights
file independently of the training-state file, so a resume silently continues from old
model weights with the newer optimizer/step state.  Here a preemption-style "reload
latest checkpoint" at step 12 finds only the weights written at step 3 (the weights
save at step 11 failed) and restores them into the compiled model; optimizer state and
step counter carry on from step 12.  Healthy twin: the step-11 weights are saved, so
the reload is a no-op.
"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
model = torch.compile(net)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
Wt = torch.randn(16, 1)
ckpt = {}
for step in range(36):
    if step == 12:                                     # preemption -> reload latest weights
        model.load_state_dict(ckpt["weights"])
        if not HEALTHY: print("ONSET step", step, "restored weights from step", ckpt["step"])
    x = torch.randn(64, 16); y = torch.sin(x @ Wt)
    loss = F.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 3 or (HEALTHY and step == 11):            # BUG: the step-11 weights save never happened
        ckpt = {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "step": step}
    if step in (11, 12, 35): print(f"step {step} loss={loss.item():.4f}")
