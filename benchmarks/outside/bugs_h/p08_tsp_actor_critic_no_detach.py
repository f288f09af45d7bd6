"""Neural combinatorial optimisation: attention pointer policy for 10-city TSP, actor-critic.

The actor (transformer encoder + pointer decoder) samples tours; the critic (a separate
set-encoder) predicts the expected tour length and serves as the REINFORCE baseline.  Actor and
critic share one Adam optimizer and the two losses are summed, as in encode-attend-navigate.
The critic is warmed up alone for a few updates before the policy-gradient term is switched on.

Modelled on: astariul/encode-attend-navigate-pytorch issue #2 "Critic not detached from policy
loss" (fixed in PR #3) — the policy loss used the critic's prediction to compute the advantage
without stopping the gradient, so "the critic network was backpropagated from both the policy
loss and critic loss, leading to unstable training".  The TF original used tf.stop_gradient.

Unusual about the loop: the critic-only warm-up means the first updates are the same with or
without the bug; the missing detach only matters from the first update that includes the
policy-gradient term.
--healthy: advantage = (tour_len - value).detach().
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

N_CITIES, D = 10, 32


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(2, D)
        self.encoder = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.q_proj = nn.Linear(2 * D, D)
        self.k_proj = nn.Linear(D, D)

    def forward(self, cities):
        b = cities.shape[0]
        h = self.encoder(self.embed(cities))
        keys = self.k_proj(h)
        graph = h.mean(1)
        visited = torch.zeros(b, N_CITIES, dtype=torch.bool)
        last = h[:, 0]
        visited[:, 0] = True
        tour, logp = [torch.zeros(b, dtype=torch.long)], torch.zeros(b)
        for _ in range(N_CITIES - 1):
            q = self.q_proj(torch.cat([graph, last], -1))
            scores = 10 * torch.tanh((keys @ q.unsqueeze(-1)).squeeze(-1) / D ** 0.5)
            scores = scores.masked_fill(visited, float("-inf"))
            dist = torch.distributions.Categorical(logits=scores)
            nxt = dist.sample()
            logp = logp + dist.log_prob(nxt)
            visited = visited.scatter(1, nxt[:, None], True)
            last = h[torch.arange(b), nxt]
            tour.append(nxt)
        return torch.stack(tour, 1), logp


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(2, D), nn.ReLU(), nn.Linear(D, D))
        self.head = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 1))

    def forward(self, cities):
        return self.head(self.embed(cities).mean(1)).squeeze(1)


def tour_length(cities, tour):
    ordered = cities.gather(1, tour[..., None].expand(-1, -1, 2))
    return (ordered - ordered.roll(-1, dims=1)).norm(dim=-1).sum(1)


def main():
    torch.manual_seed(0)
    actor, critic = Actor(), Critic()
    optimizer = torch.optim.Adam(list(actor.parameters()) + list(critic.parameters()), lr=1e-3)
    critic_warmup, n_steps, bs = 8, 40, 128
    g = torch.Generator().manual_seed(1)

    for step in range(n_steps):
        cities = torch.rand(bs, N_CITIES, 2, generator=g)
        tour, logp = actor(cities)
        length = tour_length(cities, tour)
        value = critic(cities)
        critic_loss = F.mse_loss(value, length)
        if step < critic_warmup:
            actor_loss = torch.zeros(())
            loss = critic_loss
        else:
            if HEALTHY:
                advantage = (length - value).detach()
            else:
                if step == critic_warmup:
                    print(f"ONSET step {step}")
                advantage = length - value
            actor_loss = (advantage * logp).mean()
            loss = actor_loss + critic_loss
        optimizer.zero_grad()
        if step == n_steps - 1:
            g_actor = torch.autograd.grad(actor_loss, list(critic.parameters()), retain_graph=True,
                                          allow_unused=True)
            actor_grad_on_critic = sum(x.norm() ** 2 for x in g_actor if x is not None) ** 0.5
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(actor.parameters()) + list(critic.parameters()), 1.0)
        optimizer.step()
        print(f"step {step:3d} tour {length.mean().item():.4f} critic_mse {critic_loss.item():.4f} "
              f"actor_loss {actor_loss.item():.4f}")

    print(f"EVIDENCE policy_loss_grad_norm_on_critic={float(actor_grad_on_critic):.4f} "
          f"final_critic_mse={critic_loss.item():.4f} final_mean_tour={length.mean().item():.4f}")


if __name__ == "__main__":
    main()
