"""Offline RL with a Decision Transformer trained by the HF Trainer on a toy 2-D reaching task.

Modelled on: the Hugging Face blog post "Train your first Decision Transformer"
(huggingface.co/blog/train-decision-transformers, huggingface/blog
``train-decision-transformers.md``): ``DecisionTransformerGymDataCollator`` (samples
trajectories with probability proportional to their length, random window start,
left padding, state normalisation, returns-to-go scaled by ``scale``), ``TrainableDT``
(a ``DecisionTransformerModel`` subclass whose ``forward`` returns only the masked
action MSE, plus ``original_forward`` for inference) and its TrainingArguments
(``remove_unused_columns=False``, AdamW, ``warmup_ratio=0.1``, ``max_grad_norm=0.25``).

What is unusual about the loop (all on purpose):
  * the collator ignores the features the DataLoader hands it (only their count is
    used) and draws its own trajectories from the global numpy / python RNGs;
  * padded actions are -10 and padded "dones" are 2 (as in the blog); they never reach
    the loss because the MSE is taken only where ``attention_mask`` is 1;
  * the model's training ``forward`` returns nothing but a loss; a TrainerCallback runs
    return-conditioned roll-outs through ``original_forward`` every 10 steps (mid-run,
    with its own seeded RandomState so the sampling RNG of training is untouched);
  * warm-up from lr 0 and aggressive clipping (0.25).
"""
import random
import tempfile

import numpy as np
import torch
from transformers import (DecisionTransformerConfig, DecisionTransformerModel, Trainer,
                          TrainerCallback, TrainingArguments, set_seed)

torch.set_num_threads(1)
set_seed(0)

STATE_DIM, ACT_DIM, MAX_EP_LEN, MAX_LEN, SCALE = 6, 2, 40, 10, 10.0


class ReachEnv:
    """Point mass with velocity; reward = -distance to a random goal; done when reached."""

    def __init__(self, rng):
        self.rng = rng

    def reset(self):
        self.pos = self.rng.uniform(-1, 1, 2)
        self.vel = np.zeros(2)
        self.goal = self.rng.uniform(-1, 1, 2)
        self.t = 0
        return self._obs()

    def _obs(self):
        return np.concatenate([self.pos, self.vel, self.goal]).astype(np.float32)

    def step(self, action):
        action = np.clip(action, -1, 1)
        self.vel = 0.7 * self.vel + 0.1 * action
        self.pos = self.pos + self.vel
        self.t += 1
        dist = np.linalg.norm(self.pos - self.goal)
        done = dist < 0.1 or self.t >= MAX_EP_LEN
        return self._obs(), -dist, done


def collect_dataset(n_traj=80, seed=0):
    """Noisy PD-controller demonstrations of mixed quality (noise level varies per episode)."""
    rng = np.random.RandomState(seed)
    env, dataset = ReachEnv(rng), []
    for _ in range(n_traj):
        noise = rng.choice([0.1, 0.5, 1.0])
        obs, done, traj = env.reset(), False, {"observations": [], "actions": [], "rewards": [], "dones": []}
        while not done:
            act = np.clip(2.0 * (obs[4:6] - obs[0:2]) - 1.5 * obs[2:4] + noise * rng.randn(2), -1, 1)
            traj["observations"].append(obs)
            traj["actions"].append(act.astype(np.float32))
            obs, rew, done = env.step(act)
            traj["rewards"].append(rew)
            traj["dones"].append(float(done))
        dataset.append({k: np.array(v) for k, v in traj.items()})
    return dataset


class DecisionTransformerGymDataCollator:
    def __init__(self, dataset):
        self.dataset = dataset
        self.n_traj = len(dataset)
        states = np.vstack([traj["observations"] for traj in dataset])
        self.state_mean, self.state_std = states.mean(axis=0), states.std(axis=0) + 1e-6
        traj_lens = np.array([len(traj["observations"]) for traj in dataset])
        self.p_sample = traj_lens / traj_lens.sum()

    @staticmethod
    def _discount_cumsum(x, gamma):
        out = np.zeros_like(x)
        out[-1] = x[-1]
        for t in reversed(range(x.shape[0] - 1)):
            out[t] = x[t] + gamma * out[t + 1]
        return out

    def __call__(self, features):
        batch_inds = np.random.choice(np.arange(self.n_traj), size=len(features), replace=True, p=self.p_sample)
        s, a, r, d, rtg, timesteps, mask = [], [], [], [], [], [], []
        for ind in batch_inds:
            feature = self.dataset[int(ind)]
            si = random.randint(0, len(feature["rewards"]) - 1)
            s.append(feature["observations"][si: si + MAX_LEN].reshape(1, -1, STATE_DIM))
            a.append(feature["actions"][si: si + MAX_LEN].reshape(1, -1, ACT_DIM))
            r.append(feature["rewards"][si: si + MAX_LEN].reshape(1, -1, 1))
            d.append(feature["dones"][si: si + MAX_LEN].reshape(1, -1))
            timesteps.append(np.arange(si, si + s[-1].shape[1]).reshape(1, -1))
            rtg.append(self._discount_cumsum(feature["rewards"][si:], 1.0)[: s[-1].shape[1]].reshape(1, -1, 1))
            tlen = s[-1].shape[1]
            s[-1] = np.concatenate([np.zeros((1, MAX_LEN - tlen, STATE_DIM)), s[-1]], axis=1)
            s[-1] = (s[-1] - self.state_mean) / self.state_std
            a[-1] = np.concatenate([np.ones((1, MAX_LEN - tlen, ACT_DIM)) * -10.0, a[-1]], axis=1)
            r[-1] = np.concatenate([np.zeros((1, MAX_LEN - tlen, 1)), r[-1]], axis=1)
            d[-1] = np.concatenate([np.ones((1, MAX_LEN - tlen)) * 2, d[-1]], axis=1)
            rtg[-1] = np.concatenate([np.zeros((1, MAX_LEN - tlen, 1)), rtg[-1]], axis=1) / SCALE
            timesteps[-1] = np.concatenate([np.zeros((1, MAX_LEN - tlen)), timesteps[-1]], axis=1)
            mask.append(np.concatenate([np.zeros((1, MAX_LEN - tlen)), np.ones((1, tlen))], axis=1))
        cat = lambda xs: torch.from_numpy(np.concatenate(xs)).float()  # noqa: E731
        return {"states": cat(s), "actions": cat(a), "rewards": cat(r), "returns_to_go": cat(rtg),
                "timesteps": cat(timesteps).long(), "attention_mask": cat(mask)}


class TrainableDT(DecisionTransformerModel):
    def forward(self, **kwargs):
        output = super().forward(**kwargs)
        action_preds = output[1]
        action_targets = kwargs["actions"]
        attention_mask = kwargs["attention_mask"]
        act_dim = action_preds.shape[2]
        action_preds = action_preds.reshape(-1, act_dim)[attention_mask.reshape(-1) > 0]
        action_targets = action_targets.reshape(-1, act_dim)[attention_mask.reshape(-1) > 0]
        return {"loss": torch.mean((action_preds - action_targets) ** 2)}

    def original_forward(self, **kwargs):
        return super().forward(**kwargs)


@torch.no_grad()
def evaluate_rollouts(model, collator, target_return=-3.0, episodes=4, seed=1234):
    was_training = model.training
    model.eval()
    env, returns = ReachEnv(np.random.RandomState(seed)), []
    mean, std = torch.from_numpy(collator.state_mean).float(), torch.from_numpy(collator.state_std).float()
    for _ in range(episodes):
        states = torch.from_numpy(env.reset()).reshape(1, STATE_DIM)
        actions, rewards = torch.zeros(0, ACT_DIM), torch.zeros(0)
        rtg, timesteps, ep_return, done = torch.tensor([[target_return / SCALE]]), torch.zeros(1, 1).long(), 0.0, False
        while not done:
            actions, rewards = torch.cat([actions, torch.zeros(1, ACT_DIM)]), torch.cat([rewards, torch.zeros(1)])
            n = min(states.shape[0], MAX_LEN)
            pad = MAX_LEN - n
            out = model.original_forward(
                states=torch.cat([torch.zeros(pad, STATE_DIM), ((states - mean) / std)[-n:]]).unsqueeze(0),
                actions=torch.cat([torch.zeros(pad, ACT_DIM), actions[-n:]]).unsqueeze(0),
                rewards=torch.cat([torch.zeros(pad), rewards[-n:]]).reshape(1, -1, 1),
                returns_to_go=torch.cat([torch.zeros(pad, 1), rtg[-n:]]).unsqueeze(0),
                timesteps=torch.cat([torch.zeros(pad, dtype=torch.long), timesteps[0, -n:]]).unsqueeze(0),
                attention_mask=torch.cat([torch.zeros(pad), torch.ones(n)]).unsqueeze(0), return_dict=False)
            action = out[1][0, -1]
            actions[-1] = action
            obs, reward, done = env.step(action.numpy())
            rewards[-1] = reward
            ep_return += reward
            states = torch.cat([states, torch.from_numpy(obs).reshape(1, STATE_DIM)])
            rtg = torch.cat([rtg, (rtg[-1] - reward / SCALE).reshape(1, 1)])
            timesteps = torch.cat([timesteps, torch.full((1, 1), timesteps[0, -1].item() + 1)], dim=1)
        returns.append(ep_return)
    model.train(was_training)
    return float(np.mean(returns))


class RolloutCallback(TrainerCallback):
    def __init__(self, collator, every=10):
        self.collator, self.every = collator, every

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            print(f"[rollout] step {state.global_step}: mean return {evaluate_rollouts(model, self.collator):.2f}")


def main():
    dataset = collect_dataset()
    returns = [traj["rewards"].sum() for traj in dataset]
    print(f"offline data: {len(dataset)} trajectories, return min/mean/max "
          f"{min(returns):.1f}/{np.mean(returns):.1f}/{max(returns):.1f}")
    collator = DecisionTransformerGymDataCollator(dataset)
    config = DecisionTransformerConfig(state_dim=STATE_DIM, act_dim=ACT_DIM, hidden_size=64, n_layer=2,
                                       n_head=2, n_inner=128, max_ep_len=MAX_EP_LEN, n_positions=64)
    model = TrainableDT(config)
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            output_dir=out_dir, remove_unused_columns=False, max_steps=40, per_device_train_batch_size=32,
            learning_rate=1e-3, weight_decay=1e-4, warmup_ratio=0.1, optim="adamw_torch", max_grad_norm=0.25,
            logging_steps=10, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                          callbacks=[RolloutCallback(collator)])
        print(f"[rollout] before training: mean return {evaluate_rollouts(model, collator):.2f}")
        trainer.train()


if __name__ == "__main__":
    main()
