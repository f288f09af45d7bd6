"""Reptile meta-learning on random sine-wave regression, with hand-written inner and outer updates.

Modelled on: John Schulman's ``reptile-sinewaves-demo.py`` gist, published with the
OpenAI blog post "Reptile: A Scalable Meta-Learning Algorithm" (Nichol, Achiam &
Schulman, 2018; code also in openai/supervised-reptile): ``gen_task`` (random phase and
amplitude), a Tanh MLP, ``train_on_batch`` doing ``param.data -= innerstepsize *
param.grad.data``, the outer step ``weights_before + (weights_after - weights_before) *
outerstepsize`` with a linearly annealed ``outerstepsize``, and a periodic check that
snapshots the weights, adapts for 32 steps on a fixed task, then restores the snapshot.

What is unusual about the loop (all on purpose):
  * there is no torch.optim optimizer at all: inner SGD edits ``param.data`` directly and
    the meta-update is a ``load_state_dict`` of an interpolation of two state dicts;
  * the weights jump twice per meta-iteration (5 inner steps, then moved back towards
    ``weights_before`` by a fraction 1 - outerstepsize); the inner loss is measured on
    a different random task each time, so it does not decrease across iterations;
  * the outer step size decays linearly to 0, so the last meta-update barely moves;
  * during each evaluation the model is fine-tuned on a fixed task and then restored
    from a deepcopy snapshot, so evaluation leaves no trace in the meta-parameters;
  * task sampling and evaluation use separate seeded RNGs (the evaluation task is fixed;
    its 10 support points are drawn without replacement).
"""
from copy import deepcopy

import numpy as np
import torch
from torch import nn

torch.set_num_threads(1)
seed = 0
innerstepsize = 0.02   # stepsize in inner SGD
innerepochs = 1        # number of epochs of each inner SGD
outerstepsize0 = 1.0   # stepsize of outer optimization, annealed to 0 (the demo: 0.1 over 30000 iterations)
niterations = 50       # number of outer updates; each iteration samples one task

rng = np.random.RandomState(seed)
eval_rng = np.random.RandomState(seed + 1)
torch.manual_seed(seed)

x_all = np.linspace(-5, 5, 50)[:, None]
ntrain = 10  # size of training minibatches


def gen_task(r):
    phase = r.uniform(low=0, high=2 * np.pi)
    ampl = r.uniform(0.1, 5)
    return lambda x: np.sin(x + phase) * ampl


model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def totorch(x):
    return torch.tensor(x, dtype=torch.float32)


def train_on_batch(x, y):
    x, y = totorch(x), totorch(y)
    model.zero_grad()
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    for param in model.parameters():
        param.data -= innerstepsize * param.grad.data
    return loss.item()


def predict(x):
    with torch.no_grad():
        return model(totorch(x)).numpy()


# fixed task and minibatch for evaluation
f_plot = gen_task(eval_rng)
xtrain_plot = x_all[eval_rng.choice(len(x_all), size=ntrain, replace=False)]


def evaluate(iteration):
    weights_before = deepcopy(model.state_dict())  # save snapshot before evaluation
    losses = [np.square(predict(x_all) - f_plot(x_all)).mean()]
    for inneriter in range(32):
        train_on_batch(xtrain_plot, f_plot(xtrain_plot))
        if (inneriter + 1) % 8 == 0:
            losses.append(np.square(predict(x_all) - f_plot(x_all)).mean())
    model.load_state_dict(weights_before)  # restore from snapshot
    print(f"iteration {iteration:3d}: loss on fixed task after 0/8/16/24/32 adaptation steps "
          + " ".join(f"{v:.3f}" for v in losses))
    return losses[-1]


def main():
    first = evaluate(0)
    reference = deepcopy(model.state_dict())
    for iteration in range(niterations):
        weights_before = deepcopy(model.state_dict())
        f = gen_task(rng)
        y_all = f(x_all)
        inds = rng.permutation(len(x_all))
        task_losses = []
        for _ in range(innerepochs):
            for start in range(0, len(x_all), ntrain):
                mbinds = inds[start: start + ntrain]
                task_losses.append(train_on_batch(x_all[mbinds], y_all[mbinds]))
        # (weights_after - weights_before) is the meta-gradient direction
        weights_after = model.state_dict()
        outerstepsize = outerstepsize0 * (1 - iteration / niterations)  # linear schedule
        model.load_state_dict({name: weights_before[name] + (weights_after[name] - weights_before[name]) * outerstepsize
                               for name in weights_before})
        if (iteration + 1) % 10 == 0:
            print(f"  meta-iter {iteration + 1}: inner losses first/last {task_losses[0]:.3f}/{task_losses[-1]:.3f}, "
                  f"outer step {outerstepsize:.3f}")
            snapshot = deepcopy(model.state_dict())
            last = evaluate(iteration + 1)
            assert all(torch.equal(snapshot[k], v) for k, v in model.state_dict().items())
    drift = sum((model.state_dict()[k] - reference[k]).norm().item() for k in reference)
    print(f"meta-parameters moved by {drift:.3f} in total; post-adaptation loss {first:.3f} -> {last:.3f}")


if __name__ == "__main__":
    main()
