"""p08 - class 6: accelerate + gradient accumulation (2 micro-batches per optimizer step), REINFORCE policy
on a contextual bandit.  From step 12 the RL phase clears gradients with policy.zero_grad() (the model)
instead of optimizer.zero_grad() (the AcceleratedOptimizer, a no-op on non-sync micro-steps), so every
micro-step wipes the previous one's gradient and only the last micro-batch is applied.
Modelled on: tatsu-lab/alpaca_farm #57 "Possible issue with gradient accumulation" (policy.zero_grad
used instead of optimizer.zero_grad inside accelerator.accumulate).  Onset: optimizer step 12 (0-based).
`--healthy` keeps optimizer.zero_grad()."""
import sys, torch, torch.nn as nn
from accelerate import Accelerator
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
policy = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 4))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
policy, opt = acc.prepare(policy, opt)
g = torch.Generator().manual_seed(1)
Wtrue = torch.randn(6, 4, generator=g)
baseline, step = 0.0, 0
for micro in range(72):
    step = micro // 2
    s = torch.randn(64, 6, generator=g)
    with acc.accumulate(policy):
        dist = torch.distributions.Categorical(logits=policy(s))
        a = dist.sample()
        r = (a == (s @ Wtrue).argmax(1)).float()
        baseline = 0.9 * baseline + 0.1 * r.mean().item()
        loss = -(dist.log_prob(a) * (r - baseline)).mean() - 0.01 * dist.entropy().mean()
        acc.backward(loss)
        opt.step()
        if healthy or step < 12:
            opt.zero_grad()
        else:
            if micro == 24: print("ONSET: policy.zero_grad() drops accumulated grads from optimizer step 12 (0-based)")
            policy.zero_grad()
print("final mean reward", r.mean().item())
