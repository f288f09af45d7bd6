"""A gradient clear between a backward and the optimizer step that would use it throws
that backward away (``zero_grad`` inside the accumulation loop; ``model.zero_grad()``
inside accelerate's ``accumulate``): the clear breaks ``clears_used_grads`` /
``module_clears_used_grads``.  The healthy loops a blunter rule would flag keep it or
are not judged: accumulation cleared once per step, a GAN whose generator backward
reaches the discriminator, a step GradScaler skipped on overflow, a step skipped on a
gradient-norm spike, adversarial training, a sanity backward during setup and LBFGS
closures, a clear inside sharpness-aware minimisation's own update method or after the
training loop's own climb to SAM's perturbed weights (which also keeps the iteration
whole), and a single discarded backward between two steps (a skipped step)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.events import MODULE_ZERO_GRAD, OPTIMIZER_ZERO_GRAD
from tests.support.producer_traces import trace_batches, trace_events


def _kept(tmp_path, api: str = OPTIMIZER_ZERO_GRAD, obj: str | None = None) -> list:
    """Each clear's verdict (None: not judged), of one optimizer's clears if ``obj``."""
    contracts = [(event.get("ctx") or {}).get("contract") for _, event in trace_events(trace_batches(tmp_path))
                 if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == api
                 and obj in (None, event.get("obj"))]
    return [next(iter(c.values())) if c else None for c in contracts]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _loss(model: nn.Module, x: torch.Tensor | None = None) -> torch.Tensor:
    return model(torch.randn(8, 4) if x is None else x).pow(2).mean()


def _accumulate(tmp_path, clear_every_micro_batch: bool, module_clear: bool = False) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-acc", trace_dir=tmp_path, quiet=True):
        for micro in range(12):
            if clear_every_micro_batch and micro >= 6:
                model.zero_grad() if module_clear else optimizer.zero_grad()
            _loss(model).backward()
            if micro % 3 == 2:
                optimizer.step()
                optimizer.zero_grad()


def test_a_clear_inside_the_accumulation_loop_breaks_the_contract_from_its_second_wipe(tmp_path):
    _accumulate(tmp_path, clear_every_micro_batch=True)
    # micro-batch 6 starts a cycle (nothing to wipe); 7 wipes (alone, it could be a
    # skipped step), 8 wipes again; in the next cycle 10 and 11 wipe like the one before
    assert _kept(tmp_path) == [True, True, True, None, False, True, True, False, False, True]


def test_a_model_zero_grad_inside_accumulation_breaks_the_module_contract(tmp_path):
    _accumulate(tmp_path, clear_every_micro_batch=True, module_clear=True)
    assert _kept(tmp_path, MODULE_ZERO_GRAD) == [True, None, False, True, False, False]


def test_accumulation_cleared_once_per_step_keeps_the_contract(tmp_path):
    _accumulate(tmp_path, clear_every_micro_batch=False)
    assert _kept(tmp_path) == [True, True, True, True]


def test_a_gan_whose_generator_backward_reaches_the_discriminator_keeps_the_contract(tmp_path):
    generator, discriminator = nn.Linear(2, 4), nn.Linear(4, 1)
    opt_g = torch.optim.Adam(generator.parameters())
    opt_d = torch.optim.Adam(discriminator.parameters())
    with producers.instrument(run_id="r-gan", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            discriminator.zero_grad()
            fake = generator(torch.randn(8, 2))
            (F.softplus(discriminator(fake.detach())) + F.softplus(-discriminator(torch.randn(8, 4)))).mean().backward()
            opt_d.step()
            generator.zero_grad()
            F.softplus(-discriminator(fake)).mean().backward()  # reaches the discriminator too
            opt_g.step()
    assert all(kept is not False for kept in _kept(tmp_path, MODULE_ZERO_GRAD))
    assert True in _kept(tmp_path, MODULE_ZERO_GRAD)


def _critic_phase(tmp_path, steps_critic: bool, critic_loss: bool = True) -> list:
    """A generator pre-trained alone, then a phase that adds a critic with its own optimizer."""
    generator, critic = nn.Linear(2, 4), nn.Linear(4, 1)
    opt_g = torch.optim.Adam(generator.parameters())
    with producers.instrument(run_id="r-phase", trace_dir=tmp_path, quiet=True):
        for _ in range(3):
            opt_g.zero_grad()
            generator(torch.randn(8, 2)).pow(2).mean().backward()
            opt_g.step()
        opt_d = torch.optim.Adam(critic.parameters())
        for _ in range(4):
            opt_d.zero_grad()
            fake = generator(torch.randn(8, 2))
            if critic_loss:
                (critic(fake.detach()) - critic(torch.randn(8, 4))).mean().backward()
            if steps_critic:
                opt_d.step()
            opt_g.zero_grad()
            (-critic(fake).mean()).backward()
            opt_g.step()
    return _kept(tmp_path, obj="opt1")


def test_a_critic_that_gets_gradients_and_never_steps_breaks_the_contract_from_its_second_clear(tmp_path):
    """DeblurGANv2's WGAN phase back-propagates the critics and never steps them: every
    clear after the first discards a backward meant for them while the generator steps."""
    assert _critic_phase(tmp_path / "bug", steps_critic=False) == [None, False, False, False]
    assert _critic_phase(tmp_path / "fixed", steps_critic=True) == [None, True, True, True]


def test_a_critic_not_trained_yet_that_only_the_generator_loss_reaches_is_not_judged(tmp_path):
    """A discriminator that starts later, cleared with every optimizer each iteration:
    its gradients come from the generator's loss alone."""
    assert _critic_phase(tmp_path, steps_critic=False, critic_loss=False)[1:] == [None, None, None]


def test_a_critic_that_starts_much_later_stops_being_watched(tmp_path, monkeypatch):
    """Its clears find no loss of its own: after a few, no backward's graph is walked for it."""
    from producers import unstepped_optimizers

    walks = []
    walk = unstepped_optimizers._reached_leaves
    monkeypatch.setattr(unstepped_optimizers, "_reached_leaves", lambda roots: walks.append(1) or walk(roots))
    generator, critic = nn.Linear(2, 4), nn.Linear(4, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(critic.parameters())
    with producers.instrument(run_id="r-late", trace_dir=tmp_path, quiet=True):
        for _ in range(3 * unstepped_optimizers.QUIET_CLEARS):
            opt_d.zero_grad()
            opt_g.zero_grad()
            (-critic(generator(torch.randn(8, 2)))).mean().backward()
            opt_g.step()
    assert False not in _kept(tmp_path)
    assert 0 < len(walks) <= unstepped_optimizers.QUIET_CLEARS + 1


def test_critic_iterations_on_fakes_not_detached_that_clear_the_generator_too_keep_it(tmp_path):
    """SN-GAN's reference loop: n critic updates per generator update, each clearing both
    optimizers, on ``G(z)`` not detached: the critic's loss reaches the generator before
    its first step, which is no loss of the generator's."""
    generator, critic = nn.Linear(2, 4), nn.Linear(4, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(critic.parameters())
    with producers.instrument(run_id="r-sngan", trace_dir=tmp_path, quiet=True):
        for _ in range(3):
            for _ in range(3):
                opt_d.zero_grad()
                opt_g.zero_grad()
                (F.relu(1 - critic(torch.randn(8, 4))) + F.relu(1 + critic(generator(torch.randn(8, 2))))).mean().backward()
                opt_d.step()
            opt_d.zero_grad()
            opt_g.zero_grad()
            (-critic(generator(torch.randn(8, 2)))).mean().backward()
            opt_g.step()
    assert False not in _kept(tmp_path)


def test_skipped_steps_adversarial_inputs_setup_and_closures_are_not_judged(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    with producers.instrument(run_id="r-skips", trace_dir=tmp_path, quiet=True):
        _loss(model).backward()  # a sanity backward in setup, before any step
        optimizer.zero_grad()
        for step in range(2):
            _loss(model).backward()
            optimizer.step()
            optimizer.zero_grad()
        _loss(model).backward()  # a step skipped by a guard the producer cannot see
        optimizer.zero_grad()
        _loss(model).backward()
        optimizer.step()
        optimizer.zero_grad()
        _loss(model).backward()  # a gradient-norm spike: inspected, then skipped
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.zero_grad()
        (_loss(model) * float("inf")).backward()  # overflow: not finite
        optimizer.zero_grad()
        delta = torch.zeros(8, 4, requires_grad=True)  # FGSM: input gradients, parameters' discarded
        _loss(model, torch.randn(8, 4) + delta).backward()
        optimizer.zero_grad()
        _loss(model).backward()
        optimizer.step()

        def closure():
            lbfgs.zero_grad()
            loss = _loss(model)
            loss.backward()
            return loss

        lbfgs.step(closure)
        optimizer.zero_grad()
    # setup clear, 2 clears after steps, the guarded skip, the clear after its step,
    # spike skip, overflow (wasted nothing finite), adversarial, the clear after LBFGS
    # (the closure's own clears run inside its step)
    assert _kept(tmp_path, obj="opt0") == [None, True, True, None, True, None, True, None, True]
    assert set(_kept(tmp_path, obj="opt1")) == {None}


def test_sam_written_in_the_training_loop_is_one_iteration_and_keeps_the_contract(tmp_path):
    """The loop climbs to ``w + rho * g / |g|`` in place after the first backward, clears,
    takes the second backward there, climbs back and steps (davda54/sam by hand, as in a
    LightningModule with manual optimisation)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps = 5
    with producers.instrument(run_id="r-sam", trace_dir=tmp_path, quiet=True):
        for _ in range(steps):
            x = torch.randn(8, 4)
            optimizer.zero_grad()
            _loss(model, x).backward()
            with torch.no_grad():
                norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
                climbs = [p.grad * (0.05 / norm) for p in model.parameters()]
                for p, climb in zip(model.parameters(), climbs):
                    p.add_(climb)
            optimizer.zero_grad()
            _loss(model, x).backward()
            with torch.no_grad():
                for p, climb in zip(model.parameters(), climbs):
                    p.sub_(climb)
            optimizer.step()
    assert False not in _kept(tmp_path)
    windows = {step for step, event in trace_events(trace_batches(tmp_path)) if event["kind"] == "call"}
    assert len(windows) == steps + 1  # setup, then one window per optimizer step


def _gradient_surgery(tmp_path, keep_graph: bool) -> None:
    """PCGrad by hand (WeiChengTseng/Pytorch-PCGrad's ``pc_backward``): each objective of
    one forward is back-propagated on its own after a clear, its gradients copied; the
    combined gradients are written into ``p.grad`` and the optimizer steps once."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-pcgrad", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            out = model(torch.randn(8, 4))
            objectives = [out[:, 0].pow(2).mean(), (out[:, 1] - 1).pow(2).mean()]
            copies = []
            for index, objective in enumerate(objectives):
                optimizer.zero_grad(set_to_none=True)
                objective.backward(retain_graph=keep_graph and index < len(objectives) - 1)
                copies.append([p.grad.clone() for p in model.parameters()])
                if not keep_graph and index < len(objectives) - 1:
                    out = model(torch.randn(8, 4))  # no retained graph: a new forward
                    objectives[index + 1] = (out[:, 1] - 1).pow(2).mean()
            for p, *grads in zip(model.parameters(), *copies):
                p.grad = sum(grads)
            optimizer.step()


def test_gradient_surgery_over_a_retained_graph_is_one_iteration_and_not_judged(tmp_path):
    _gradient_surgery(tmp_path, keep_graph=True)
    assert False not in _kept(tmp_path)
    windows = {step for step, event in trace_events(trace_batches(tmp_path)) if event["kind"] == "call"}
    assert windows == {1, 2, 3, 4}  # one window per optimizer step (setup recorded nothing)


def test_the_same_clears_between_forwards_of_their_own_are_still_judged(tmp_path):
    _gradient_surgery(tmp_path, keep_graph=False)
    assert False in _kept(tmp_path)
