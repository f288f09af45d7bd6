"""P06 (class c: model.train() called on a wrapper that does not reach the inner model) -- RL (REINFORCE).

Modelled on namisan/mt-dnn#45 "Evaluation mode ignored for dropout list" (sub-modules
kept in a plain Python list are not registered, so .train()/.eval() on the wrapper never
reach them).  The Agent wrapper keeps its policy nets in a Python list.  After a greedy
evaluation rollout at step 11 the eval code calls policy.eval() directly, and the
training loop's agent.train() does not reach the policy, so from step 12 the policy
trains with dropout off (and the exploration noise layer disabled).
Healthy twin: nets kept in nn.ModuleList, so agent.train() reaches the policy.
"""
import sys, torch, torch.nn as nn
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
NA, NS = 4, 6
class Agent(nn.Module):
    def __init__(s):
        super().__init__()
        pol = nn.Sequential(nn.Linear(NS, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, NA))
        s.nets = nn.ModuleList([pol]) if HEALTHY else [pol]       # BUG: plain list
    @property
    def policy(s): return s.nets[0]
agent = Agent()
opt = torch.optim.Adam(agent.policy.parameters(), lr=1e-2)
Wenv = torch.randn(NS, NA)
def env_batch(n=128):                 # contextual bandit: reward 1 for best arm
    s = torch.randn(n, NS); return s, (s @ Wenv).argmax(1)
for step in range(36):
    agent.train()
    if step == 12 and not HEALTHY: print("ONSET step", step, "policy.training=", agent.policy.training)
    s, best = env_batch()
    dist = torch.distributions.Categorical(logits=agent.policy(s))
    a = dist.sample(); r = (a == best).float()
    loss = -((r - r.mean()) * dist.log_prob(a)).mean() - 0.01 * dist.entropy().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 11:
        agent.policy.eval()                                   # greedy evaluation rollout
        with torch.no_grad():
            s, best = env_batch(512); print("eval acc", (agent.policy(s).argmax(1) == best).float().mean().item())
    if step in (11, 12, 35): print(f"step {step} policy.training={agent.policy.training} reward={r.mean().item():.3f}")
