"""Modelled on sfujim/TD3 (TD3.py + main.py, Fujimoto et al. 2018).

Exercises actor-critic RL with two optimizers and target networks: twin critics trained
every step on clipped double-Q targets computed under no_grad from deepcopy'd target
networks; the actor (and the Polyak soft update of all targets) runs only every
`policy_freq` critic steps ("delayed policy updates"), so the actor's optimizer steps
less often than the critic's. Target networks never receive gradients. The environment is a
tiny point-mass reaching task written in torch; a replay buffer is filled with a random
policy before learning starts, as in main.py (start_timesteps).
"""
import copy
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)


class Actor(nn.Module):
    def __init__(self, state_dim, action_dim, max_action):
        super().__init__()
        self.l1 = nn.Linear(state_dim, 64)
        self.l2 = nn.Linear(64, 64)
        self.l3 = nn.Linear(64, action_dim)
        self.max_action = max_action

    def forward(self, state):
        a = F.relu(self.l1(state))
        a = F.relu(self.l2(a))
        return self.max_action * torch.tanh(self.l3(a))


class Critic(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.l1 = nn.Linear(state_dim + action_dim, 64)
        self.l2 = nn.Linear(64, 64)
        self.l3 = nn.Linear(64, 1)
        self.l4 = nn.Linear(state_dim + action_dim, 64)
        self.l5 = nn.Linear(64, 64)
        self.l6 = nn.Linear(64, 1)

    def forward(self, state, action):
        sa = torch.cat([state, action], 1)
        q1 = self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))
        q2 = self.l6(F.relu(self.l5(F.relu(self.l4(sa)))))
        return q1, q2

    def Q1(self, state, action):
        sa = torch.cat([state, action], 1)
        return self.l3(F.relu(self.l2(F.relu(self.l1(sa)))))


class TD3:
    def __init__(self, state_dim, action_dim, max_action, discount=0.99, tau=0.005,
                 policy_noise=0.2, noise_clip=0.5, policy_freq=2):
        self.actor = Actor(state_dim, action_dim, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-4)
        self.critic = Critic(state_dim, action_dim)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=3e-4)
        self.max_action, self.discount, self.tau = max_action, discount, tau
        self.policy_noise, self.noise_clip, self.policy_freq = policy_noise, noise_clip, policy_freq
        self.total_it = 0

    def select_action(self, state):
        with torch.no_grad():
            return self.actor(state.reshape(1, -1)).flatten()

    def train(self, replay_buffer, batch_size=64):
        self.total_it += 1
        state, action, next_state, reward, not_done = replay_buffer.sample(batch_size)
        with torch.no_grad():
            noise = (torch.randn_like(action) * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
            next_action = (self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)
            target_Q1, target_Q2 = self.critic_target(next_state, next_action)
            target_Q = torch.min(target_Q1, target_Q2)
            target_Q = reward + not_done * self.discount * target_Q
        current_Q1, current_Q2 = self.critic(state, action)
        critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        actor_loss = None
        if self.total_it % self.policy_freq == 0:
            actor_loss = -self.critic.Q1(state, self.actor(state)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            for param, target_param in zip(self.critic.parameters(), self.critic_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
            for param, target_param in zip(self.actor.parameters(), self.actor_target.parameters()):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)
        return critic_loss.item(), (None if actor_loss is None else actor_loss.item())


class ReplayBuffer:
    def __init__(self, state_dim, action_dim, max_size=10000):
        self.max_size, self.ptr, self.size = max_size, 0, 0
        self.state = torch.zeros(max_size, state_dim)
        self.action = torch.zeros(max_size, action_dim)
        self.next_state = torch.zeros(max_size, state_dim)
        self.reward = torch.zeros(max_size, 1)
        self.not_done = torch.zeros(max_size, 1)

    def add(self, s, a, s2, r, done):
        self.state[self.ptr], self.action[self.ptr], self.next_state[self.ptr] = s, a, s2
        self.reward[self.ptr], self.not_done[self.ptr] = r, 1.0 - done
        self.ptr = (self.ptr + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def sample(self, batch_size):
        ind = torch.randint(0, self.size, (batch_size,))
        return (self.state[ind], self.action[ind], self.next_state[ind], self.reward[ind], self.not_done[ind])


class PointReach:
    """2-D point mass; state = (pos, goal); reward = -distance."""
    def reset(self):
        self.pos, self.goal, self.t = torch.rand(2) * 2 - 1, torch.rand(2) * 2 - 1, 0
        return torch.cat([self.pos, self.goal])

    def step(self, a):
        self.pos = (self.pos + 0.1 * a).clamp(-1, 1)
        self.t += 1
        d = (self.pos - self.goal).norm()
        done = float(d < 0.05 or self.t >= 25)
        return torch.cat([self.pos, self.goal]), -d.item(), done


env, state_dim, action_dim, max_action = PointReach(), 4, 2, 1.0
policy = TD3(state_dim, action_dim, max_action)
buf = ReplayBuffer(state_dim, action_dim)
start_timesteps, max_timesteps, expl_noise = 200, 250, 0.1
state, ep_ret = env.reset(), 0.0
for t in range(max_timesteps):
    if t < start_timesteps:
        action = torch.rand(action_dim) * 2 - 1
    else:
        action = (policy.select_action(state) + torch.randn(action_dim) * max_action * expl_noise
                  ).clamp(-max_action, max_action)
    next_state, reward, done = env.step(action)
    buf.add(state, action, next_state, reward, done)
    state, ep_ret = next_state, ep_ret + reward
    if t >= start_timesteps:
        c_loss, a_loss = policy.train(buf)
        if policy.total_it % 10 == 0:
            print(f"t={t} critic_loss={c_loss:.4f} actor_loss={a_loss:.4f}")
    if done:
        state, ep_ret = env.reset(), 0.0
print("critic updates:", policy.total_it, "actor updates:", policy.total_it // policy.policy_freq)
