"""Healthy probe: DQN in the PyTorch reinforcement-learning tutorial style: acting without gradients, a target network hard-updated with load_state_dict every few steps, smooth L1, clip_grad_value_."""
import torch, random
from torch import nn
torch.manual_seed(0); random.seed(0)
policy = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2)); target = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
target.load_state_dict(policy.state_dict()); target.eval()
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
buffer = [(torch.randn(4), random.randint(0, 1), random.random(), torch.randn(4)) for _ in range(256)]
for step in range(12):
    with torch.no_grad():
        a = policy(torch.randn(1, 4)).argmax(1)   # acting
    batch = random.sample(buffer, 32)
    s = torch.stack([b[0] for b in batch]); act = torch.tensor([b[1] for b in batch]); r = torch.tensor([b[2] for b in batch]); s2 = torch.stack([b[3] for b in batch])
    q = policy(s).gather(1, act[:, None]).squeeze(1)
    with torch.no_grad():
        tgt = r + 0.99 * target(s2).max(1).values
    loss = nn.functional.smooth_l1_loss(q, tgt)
    opt.zero_grad(); loss.backward(); nn.utils.clip_grad_value_(policy.parameters(), 100); opt.step()
    if step % 4 == 3:
        target.load_state_dict(policy.state_dict())
print("done")
