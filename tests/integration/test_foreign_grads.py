"""A discriminator that steps on what the generator's loss left in its gradients breaks
``steps_own_grads``: the generator's backward ran through it, the generator stepped, and
the discriminator's own backward added to the same gradients.  Clearing right before its
own backward, switching its ``requires_grad`` off for the generator's loss, one loss
stepped by two optimizers and an optimizer stepped at a slower rate over the same losses
keep it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "steps_own_grads"
ITERATIONS, ADVERSARIAL_FROM = 6, 3


def _verdicts(tmp_path, obj: str) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT, "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP
            and event.get("obj") == obj]


def _gan(tmp_path, *, discriminator: str) -> None:
    """Generator then discriminator each iteration; ``discriminator`` says how its
    gradients are kept apart from the generator's loss: ``late`` (cleared only after its
    step: the bug), ``clear`` (right before its backward) or ``frozen`` (requires_grad
    off during the generator's backward, cleared only after its step)."""
    torch.manual_seed(0)
    generator, critic = nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-foreign", trace_dir=tmp_path, quiet=True):
        for iteration in range(ITERATIONS):
            fake, real = generator(torch.randn(8, 4)), torch.randn(8, 6)
            adversarial = iteration >= ADVERSARIAL_FROM
            if discriminator == "frozen":
                critic.requires_grad_(False)
            opt_g.zero_grad()
            g_loss = F.mse_loss(fake, real) + (-critic(fake).mean() if adversarial else 0.0)
            g_loss.backward()
            opt_g.step()
            critic.requires_grad_(True)
            if discriminator == "clear":
                opt_d.zero_grad()
            d_loss = F.relu(1 - critic(real)).mean() + F.relu(1 + critic(fake.detach())).mean()
            d_loss.backward()
            opt_d.step()
            opt_d.zero_grad()


def test_a_discriminator_stepping_on_the_generators_leftover_breaks_it(tmp_path):
    _gan(tmp_path, discriminator="late")
    assert _verdicts(tmp_path, "opt1") == [True] * ADVERSARIAL_FROM + [False] * (ITERATIONS - ADVERSARIAL_FROM)
    assert set(_verdicts(tmp_path, "opt0")) == {True}


@pytest.mark.parametrize("discriminator", ["clear", "frozen"])
def test_a_discriminator_kept_apart_keeps_it(tmp_path, discriminator):
    _gan(tmp_path, discriminator=discriminator)
    assert set(_verdicts(tmp_path, "opt0") + _verdicts(tmp_path, "opt1")) == {True}


@pytest.mark.parametrize("slow_every", [1, 2])
def test_losses_every_step_of_which_fed_another_optimizer_keep_it(tmp_path, slow_every):
    """A body and a head stepped by their own optimizers over one loss each iteration,
    the head every ``slow_every`` iterations over the losses accumulated since."""
    torch.manual_seed(0)
    body, head = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_body = torch.optim.SGD(body.parameters(), lr=0.01)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.01)
    with producers.instrument(run_id="r-foreign", trace_dir=tmp_path, quiet=True):
        for iteration in range(6):
            F.mse_loss(head(torch.tanh(body(torch.randn(8, 4)))), torch.randn(8, 1)).backward()
            opt_body.step()
            opt_body.zero_grad()
            if iteration % slow_every == slow_every - 1:
                opt_head.step()
                opt_head.zero_grad()
    assert set(_verdicts(tmp_path, "opt0") + _verdicts(tmp_path, "opt1")) == {True}


@pytest.mark.parametrize("inner", ["copy", "separate"])
def test_an_inner_loop_over_a_deep_copy_sends_the_meta_gradient_back_on_purpose(tmp_path, inner):
    """ProtoMAML: each task adapts a deep copy of the meta-model with its own optimizer,
    whose losses also reach the meta-parameters (the output layer is built from
    prototypes the meta-model computes); the meta-optimizer then adds its own query
    backward.  A second model that is no copy, stepped the same way, still breaks it."""
    torch.manual_seed(0)
    meta = nn.Linear(4, 3)
    meta_opt = torch.optim.Adam(meta.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-maml", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            meta_opt.zero_grad()
            local = copy.deepcopy(meta) if inner == "copy" else nn.Linear(4, 3)
            local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
            prototypes = meta(torch.randn(3, 4))  # with gradients into the meta-model
            for _ in range(2):
                local_opt.zero_grad()
                (local(torch.randn(8, 4)) @ prototypes.T).pow(2).mean().backward(retain_graph=True)
                local_opt.step()
            meta(torch.randn(8, 4)).pow(2).mean().backward()
            meta_opt.step()
    verdicts = _verdicts(tmp_path, "opt0")
    assert (False in verdicts) == (inner == "separate"), verdicts
