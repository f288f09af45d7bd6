"""P06 (class: target-network synchronisation in the wrong direction -- the online/policy network is
overwritten with the (stale) target network, i.e. the trained weights are silently reset every sync)
-- plain PyTorch DQN loop in the style of the PyTorch "Reinforcement Learning (DQN) Tutorial".

Modelled on kengz/SLM-Lab#169 "fix wrong dqn replace" ("DQN replace scheme had the wrong replace direction")
and thesouther/MARL#8 (target-network update bug: the target net loaded its own state dict instead of the
eval net's).  The hard update should be `target_net.load_state_dict(policy_net.state_dict())`; the bug is
`policy_net.load_state_dict(target_net.state_dict())`.  Because the target net is never refreshed, every sync
(first one after optimizer step 11) rewinds the policy network to its initial weights.  Nothing crashes; the
loss simply drops back and the greedy return never improves.

Environment: a synthetic noisy 1-D corridor (goal at the right end) with feature observations, replay memory
pre-filled with random transitions, epsilon-greedy acting, one optimizer step per environment step, Huber loss,
gradient value clipping, periodic greedy evaluation and a final checkpoint.  Healthy twin: correct direction.
"""
import argparse
import math
import random
from collections import deque, namedtuple
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--num-steps", type=int, default=36)
parser.add_argument("--target-update", type=int, default=12)
args = parser.parse_args()
HEALTHY = args.healthy

random.seed(0)
torch.manual_seed(0)
BATCH_SIZE = 64
GAMMA = 0.9
EPS_START, EPS_END, EPS_DECAY = 0.9, 0.05, 30
LR = 3e-3


class CorridorEnv:
    """Agent on positions 0..L-1, starts at random position, reward +1 at the right end, -0.02 per move."""

    def __init__(self, length=10, obs_dim=12, seed=0):
        self.length, self.obs_dim = length, obs_dim
        self.g = torch.Generator().manual_seed(seed)
        self.proj = torch.randn(length, obs_dim, generator=torch.Generator().manual_seed(123))
        self.n_actions = 3  # left, stay, right

    def _obs(self):
        return self.proj[self.pos] + 0.1 * torch.randn(self.obs_dim, generator=self.g)

    def reset(self):
        self.pos = int(torch.randint(0, self.length - 1, (1,), generator=self.g))
        self.t = 0
        return self._obs()

    def step(self, action):
        self.pos = max(0, min(self.length - 1, self.pos + (action - 1)))
        self.t += 1
        terminated = self.pos == self.length - 1
        truncated = self.t >= 20
        reward = 1.0 if terminated else -0.02
        return self._obs(), reward, terminated, truncated


Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class ReplayMemory:
    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)

    def push(self, *a):
        self.memory.append(Transition(*a))

    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class DQN(nn.Module):
    def __init__(self, n_observations, n_actions):
        super().__init__()
        self.layer1 = nn.Linear(n_observations, 64)
        self.layer2 = nn.Linear(64, 64)
        self.layer3 = nn.Linear(64, n_actions)

    def forward(self, x):
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        return self.layer3(x)


env = CorridorEnv(seed=1)
eval_env = CorridorEnv(seed=2)
policy_net = DQN(env.obs_dim, env.n_actions)
target_net = DQN(env.obs_dim, env.n_actions)
target_net.load_state_dict(policy_net.state_dict())
optimizer = torch.optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(2000)
steps_done = 0


def select_action(state):
    global steps_done
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
    steps_done += 1
    if random.random() > eps_threshold:
        with torch.no_grad():
            return policy_net(state.unsqueeze(0)).max(1).indices.view(1, 1)
    return torch.tensor([[random.randrange(env.n_actions)]], dtype=torch.long)


def optimize_model():
    transitions = memory.sample(BATCH_SIZE)
    batch = Transition(*zip(*transitions))
    non_final_mask = torch.tensor(tuple(s is not None for s in batch.next_state), dtype=torch.bool)
    non_final_next_states = torch.stack([s for s in batch.next_state if s is not None])
    state_batch = torch.stack(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.tensor(batch.reward)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected = (next_state_values * GAMMA) + reward_batch
    loss = nn.SmoothL1Loss()(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    return loss.item(), state_action_values.mean().item()


@torch.no_grad()
def evaluate(n_episodes=4):
    total = 0.0
    for _ in range(n_episodes):
        s = eval_env.reset()
        while True:
            a = policy_net(s.unsqueeze(0)).argmax(1).item()
            s, r, term, trunc = eval_env.step(a)
            total += r
            if term or trunc:
                break
    return total / n_episodes


# warm-up: fill replay memory with random-policy transitions (no optimisation)
state = env.reset()
for _ in range(256):
    a = torch.tensor([[random.randrange(env.n_actions)]])
    obs, r, term, trunc = env.step(a.item())
    memory.push(state, a, None if term else obs, r)
    state = env.reset() if (term or trunc) else obs
print(f"replay memory pre-filled with {len(memory)} transitions; greedy return {evaluate():.3f}")

state = env.reset()
episode_return, episodes = 0.0, 0
for opt_step in range(args.num_steps):
    if not HEALTHY and opt_step == args.target_update:
        print(f"ONSET step {opt_step}")  # first optimizer step after the (reversed) target sync
    action = select_action(state)
    obs, reward, terminated, truncated = env.step(action.item())
    episode_return += reward
    memory.push(state, action, None if terminated else obs, reward)
    state = obs
    loss, q_mean = optimize_model()
    if (opt_step + 1) % args.target_update == 0:
        if HEALTHY:
            target_net.load_state_dict(policy_net.state_dict())
        else:
            policy_net.load_state_dict(target_net.state_dict())  # BUG: wrong direction
        print(f"step {opt_step}: target network synchronised; greedy eval return {evaluate():.3f}")
    if terminated or truncated:
        episodes += 1
        print(f"  episode {episodes} finished at step {opt_step}, return {episode_return:.2f}")
        state, episode_return = env.reset(), 0.0
    if opt_step % 4 == 0:
        print(f"step {opt_step} loss {loss:.5f} mean Q(s,a) {q_mean:.4f}")
torch.save({"policy_net": policy_net.state_dict(), "target_net": target_net.state_dict(),
            "optimizer": optimizer.state_dict()}, "p06_dqn_checkpoint.pt")
print(f"final greedy return {evaluate():.3f}")
