"""Deep Q-learning with a replay memory and a soft-updated target network on a numpy cart-pole.

Modelled on: the PyTorch tutorial "Reinforcement Learning (DQN) Tutorial"
(https://pytorch.org/tutorials/intermediate/reinforcement_q_learning.html,
pytorch/tutorials intermediate_source/reinforcement_q_learning.py).
Habits reproduced: a Transition namedtuple and deque ReplayMemory, epsilon-greedy
select_action() with the policy net under torch.no_grad(), optimize_model() that returns
early until the memory holds a batch, non-final-state masking, Q(s, a) via gather, target
values from target_net under torch.no_grad(), SmoothL1Loss, clip_grad_value_, AdamW with
amsgrad, and a soft (Polyak) update written into target_net with load_state_dict after every
environment step. "--steps" counts optimizer steps; warm-up env steps before the memory
fills take none. The gym CartPole is replaced by a numpy simulator with the same API.
"""
import argparse
import math
import random
from collections import namedtuple, deque
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class CartPoleEnv:
    """Pole on a cart, two actions (push left / right), reward 1 per step until it falls."""

    def __init__(self, max_steps=100):
        self.max_steps = max_steps
        self.np_random = np.random.RandomState()
        self.state = None
        self.steps = 0

    def reset(self, seed=None):
        if seed is not None:
            self.np_random = np.random.RandomState(seed)
        self.state = self.np_random.uniform(low=-0.05, high=0.05, size=(4,))
        self.steps = 0
        return self.state.astype(np.float32), {}

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos_t, sin_t = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot ** 2 * sin_t) / 1.1
        theta_acc = (9.8 * sin_t - cos_t * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos_t ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos_t / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        self.steps += 1
        terminated = bool(abs(x) > 2.4 or abs(theta) > 0.2095)
        truncated = self.steps >= self.max_steps
        return self.state.astype(np.float32), 1.0, terminated, truncated, {}


Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class ReplayMemory(object):

    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)

    def push(self, *args):
        """Save a transition"""
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class DQN(nn.Module):

    def __init__(self, n_observations, n_actions):
        super(DQN, self).__init__()
        self.layer1 = nn.Linear(n_observations, 64)
        self.layer2 = nn.Linear(64, 64)
        self.layer3 = nn.Linear(64, n_actions)

    # Called with either one element to determine next action, or a batch
    # during optimization. Returns tensor([[left0exp,right0exp]...]).
    def forward(self, x):
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        return self.layer3(x)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300, help="optimizer steps to take")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--max-episodes", type=int, default=1000)
args = parser.parse_args()

# BATCH_SIZE is the number of transitions sampled from the replay buffer
# GAMMA is the discount factor
# EPS_START / EPS_END / EPS_DECAY shape the exponential decay of epsilon
# TAU is the update rate of the target network
# LR is the learning rate of the AdamW optimizer
BATCH_SIZE = args.batch_size
GAMMA = 0.99
EPS_START = 0.9
EPS_END = 0.05
EPS_DECAY = 1000
TAU = 0.005
LR = 1e-4

random.seed(args.seed)
torch.manual_seed(args.seed)
device = torch.device("cpu")

env = CartPoleEnv()
n_actions = 2
state, info = env.reset(seed=args.seed)
n_observations = len(state)

policy_net = DQN(n_observations, n_actions).to(device)
target_net = DQN(n_observations, n_actions).to(device)
target_net.load_state_dict(policy_net.state_dict())

optimizer = optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(10000)

steps_done = 0
optimizer_steps = 0


def select_action(state):
    global steps_done
    sample = random.random()
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1. * steps_done / EPS_DECAY)
    steps_done += 1
    if sample > eps_threshold:
        with torch.no_grad():
            # t.max(1) returns the largest column value of each row; its index is the action
            return policy_net(state).max(1).indices.view(1, 1)
    else:
        return torch.tensor([[random.randrange(n_actions)]], device=device, dtype=torch.long)


def optimize_model():
    global optimizer_steps
    if len(memory) < BATCH_SIZE:
        return None
    transitions = memory.sample(BATCH_SIZE)
    # Transpose the batch: a list of Transitions becomes a Transition of batch-arrays.
    batch = Transition(*zip(*transitions))

    # Compute a mask of non-final states and concatenate the batch elements
    non_final_mask = torch.tensor(tuple(map(lambda s: s is not None, batch.next_state)), device=device, dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)

    # Q(s_t, a): the model computes Q(s_t), then we select the columns of actions taken.
    state_action_values = policy_net(state_batch).gather(1, action_batch)

    # V(s_{t+1}) for all next states from the "older" target_net; 0 for final states.
    next_state_values = torch.zeros(BATCH_SIZE, device=device)
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch

    # Compute Huber loss
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))

    # Optimize the model
    optimizer.zero_grad()
    loss.backward()
    # In-place gradient clipping
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    optimizer_steps += 1
    return loss.item()


episode_durations = []
for i_episode in range(args.max_episodes):
    if optimizer_steps >= args.steps:
        break
    # Initialize the environment and get its state
    state, info = env.reset()
    state = torch.tensor(state, dtype=torch.float32, device=device).unsqueeze(0)
    for t in count():
        action = select_action(state)
        observation, reward, terminated, truncated, _ = env.step(action.item())
        reward = torch.tensor([reward], device=device)
        done = terminated or truncated

        if terminated:
            next_state = None
        else:
            next_state = torch.tensor(observation, dtype=torch.float32, device=device).unsqueeze(0)

        # Store the transition in memory
        memory.push(state, action, next_state, reward)

        # Move to the next state
        state = next_state

        # Perform one step of the optimization (on the policy network)
        loss = optimize_model()

        # Soft update of the target network's weights
        # θ′ ← τ θ + (1 −τ )θ′
        target_net_state_dict = target_net.state_dict()
        policy_net_state_dict = policy_net.state_dict()
        for key in policy_net_state_dict:
            target_net_state_dict[key] = policy_net_state_dict[key] * TAU + target_net_state_dict[key] * (1 - TAU)
        target_net.load_state_dict(target_net_state_dict)

        if done or optimizer_steps >= args.steps:
            episode_durations.append(t + 1)
            print("episode %d: %d steps, memory %d, optimizer steps %d, last loss %s" % (
                i_episode, t + 1, len(memory), optimizer_steps, "n/a" if loss is None else "%.4f" % loss))
            break

print("Complete; mean episode duration %.1f" % (sum(episode_durations) / max(len(episode_durations), 1)))
