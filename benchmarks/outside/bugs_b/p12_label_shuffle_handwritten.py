"""P12 (class g: labels shuffled independently of inputs) -- hand-written SGD, no torch.optim.

Modelled on udacity/sdc-issue-reports#1326 "T1 L7 P33 Quiz doesn't verify training set and
labels match" (features and labels shuffled with different permutations still pass) and
LabeliaLabs/distributed-learning-contributivity PR #260 "Fix the shuffling of labels".
Epoch 0 uses the data in order; from epoch 1 (step 12) a per-epoch reshuffle applies one
permutation to X and a different one to y, so inputs and labels no longer match.
Healthy twin: one permutation for both.
"""
import sys, torch, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
N, D, C, BS = 384, 12, 4, 32
X = torch.randn(N, D); Wt = torch.randn(D, C); Y = (X @ Wt).argmax(1)
W1 = (torch.randn(D, 64) * 0.3).requires_grad_(); b1 = torch.zeros(64, requires_grad=True)
W2 = (torch.randn(64, C) * 0.1).requires_grad_(); b2 = torch.zeros(C, requires_grad=True)
params = [W1, b1, W2, b2]; lr = 0.1
step = 0
for epoch in range(3):
    if epoch > 0:
        p = torch.randperm(N)
        Xe = X[p]; Ye = Y[p] if HEALTHY else Y[torch.randperm(N)]          # BUG: second permutation
    else:
        Xe, Ye = X, Y
    for i in range(0, N, BS):
        xb, yb = Xe[i:i + BS], Ye[i:i + BS]
        if step == 12 and not HEALTHY: print("ONSET step", step)
        loss = F.cross_entropy(torch.relu(xb @ W1 + b1) @ W2 + b2, yb)
        for q in params: q.grad = None
        loss.backward()
        with torch.no_grad():
            for q in params: q -= lr * q.grad
        if step in (11, 12, 35):
            print(f"step {step} label-agreement={(yb == (xb @ Wt).argmax(1)).float().mean():.2f} loss={loss.item():.3f}")
        step += 1
