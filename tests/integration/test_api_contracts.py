"""The producer evaluates four documented torch contracts on the calls they are about:
a clip after ``GradScaler.unscale_``, a restore that restores something, an optimizer
that keeps the state of the one it replaces, a shuffling DistributedSampler that moves
to a new epoch per training pass.  Healthy variants (the ones a blunter rule would flag)
keep each contract."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import producers
from invariants.events import CLIP_GRAD_NORM, DATALOADER_EPOCH, MODULE_LOAD_STATE_DICT, OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _contracts(tmp_path, api: str) -> list[dict]:
    return [(event.get("ctx") or {}).get("contract") for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == api]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _backward(model: nn.Module, scaler=None) -> None:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    (scaler.scale(loss) if scaler is not None else loss).backward()


def test_a_clip_of_gradients_still_multiplied_by_the_loss_scale_breaks_the_contract(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    with producers.instrument(run_id="r-clip", trace_dir=tmp_path, quiet=True):
        for unscale in (True, False):
            optimizer.zero_grad()
            _backward(model, scaler)
            if unscale:
                scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        for other in (disabled, None):  # a disabled scaler, or none: nothing is scaled
            optimizer.zero_grad()
            _backward(model, other)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    assert _contracts(tmp_path, CLIP_GRAD_NORM) == [
        {"unscaled_grads": True}, {"unscaled_grads": False}, {"unscaled_grads": True}, {"unscaled_grads": True}]


class _Renaming(nn.Module):
    """Rewrites checkpoint keys with a load hook (as FSDP and some libraries do)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)
        self.register_load_state_dict_pre_hook(lambda *args, **kwargs: None)


class _OwnLoad(nn.Sequential):
    """A subclass whose own load_state_dict calls the base one: recorded once."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def test_a_restore_that_hands_the_module_nothing_new_breaks_the_contract(tmp_path):
    model = _OwnLoad(nn.Linear(4, 4))
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    with producers.instrument(run_id="r-load", trace_dir=tmp_path, quiet=True):
        model.load_state_dict(checkpoint)  # a copy: restores
        model.load_state_dict(copy.deepcopy(model.state_dict()))
        model.load_state_dict({f"module.{k}": v for k, v in checkpoint.items()}, strict=False)  # no key matches
        best = model.state_dict()  # kept without copying: the model's own tensors
        model.load_state_dict(best)
        merged = model.state_dict()
        merged.update({f"module.{k}": v for k, v in checkpoint.items()})
        model.load_state_dict({k: v for k, v in merged.items() if not k.startswith("module.")})
        _Renaming().load_state_dict({"inner.weight": torch.zeros(2, 2), "inner.bias": torch.zeros(2)})
        nn.ReLU().load_state_dict({})  # nothing to restore: not judged
    assert _contracts(tmp_path, MODULE_LOAD_STATE_DICT) == [
        {"replaces_weights": True}, {"replaces_weights": True}, {"replaces_weights": False},
        {"replaces_weights": False}, {"replaces_weights": False}, None, None]


def _step_contracts(tmp_path) -> list[bool]:
    found = [c["keeps_optimizer_state"] for c in _contracts(tmp_path, OPTIMIZER_STEP)]
    return found


def test_an_identical_optimizer_rebuilt_over_trained_parameters_breaks_the_contract_once(tmp_path):
    model = _model()

    def steps(optimizer, count=2):
        for _ in range(count):
            optimizer.zero_grad()
            _backward(model)
            optimizer.step()
        return optimizer

    with producers.instrument(run_id="r-restart", trace_dir=tmp_path, quiet=True):
        first = steps(torch.optim.Adam(model.parameters(), lr=1e-2))
        steps(torch.optim.Adam(model.parameters(), lr=1e-2))  # rebuilt: state thrown away
        resumed = torch.optim.Adam(model.parameters(), lr=1e-2)
        resumed.load_state_dict(first.state_dict())  # a resume keeps it
        steps(resumed, 1)
        steps(torch.optim.Adam(model.parameters(), lr=1e-3), 1)  # a new phase at another rate
        steps(torch.optim.SGD(model.parameters(), lr=0.1), 1)
        steps(torch.optim.SGD(model.parameters(), lr=0.1), 1)  # plain SGD keeps no state to lose
        fresh = _model()  # a new model (a sweep): its parameters were never trained
        for _ in range(2):
            optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2)
            optimizer.zero_grad()
            fresh(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            fresh = _model()
    assert _step_contracts(tmp_path) == [True, True, False, True, True, True, True, True, True, True]


def _loader(shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    data = TensorDataset(torch.randn(16, 4))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=shuffle, seed=0)
    return DataLoader(data, batch_size=8, sampler=sampler), sampler


def test_a_training_pass_that_replays_the_previous_epoch_breaks_the_contract(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train, sampler = _loader(shuffle=True)
    ordered, _ = _loader(shuffle=False)

    def train_pass():
        for (x,) in train:
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()

    with producers.instrument(run_id="r-epochs", trace_dir=tmp_path, quiet=True):
        for epoch in range(2):
            sampler.set_epoch(epoch)
            train_pass()
            with torch.no_grad():  # accuracy on the training set: same epoch, not judged
                for (x,) in train:
                    model(x)
            model.eval()
            for (x,) in train:  # in evaluation mode: not judged either
                model(x)
            model.train()
            for (x,) in ordered:  # a sampler that does not shuffle: nothing to judge
                model(x)
        train_pass()  # set_epoch forgotten: the previous epoch again
    assert _contracts(tmp_path, DATALOADER_EPOCH) == [
        {"reshuffles_each_epoch": True}, {"reshuffles_each_epoch": True}, {"reshuffles_each_epoch": False}]


class _Net(nn.Module):
    """A backbone, a head, and a small pooler that runs but that the loss never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32))
        self.pooler = nn.Linear(32, 1, bias=False)  # smaller than the head
        self.head = nn.Linear(32, 1)
        self.cut = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cut == "no_grad":  # a deliberate freeze: the backbone runs without gradients
            with torch.no_grad():
                features = self.backbone(x)
        else:
            features = self.backbone(x)
        self.pooler(features)  # computed and ignored
        return self.head(features.detach() if self.cut == "detach" else features)


def test_an_optimizer_step_after_a_detach_cut_off_most_of_what_ran_breaks_the_contract(tmp_path):
    model = _Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    lbfgs = torch.optim.LBFGS(model.head.parameters(), max_iter=2)
    with producers.instrument(run_id="r-cut", trace_dir=tmp_path, quiet=True):
        for cut in ("none", "no_grad", "detach"):
            model.cut = cut
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
        model.cut = "none"
        for param in model.backbone.parameters():
            param.requires_grad_(False)  # frozen the documented way
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()

        def closure():  # gradients exist only once the closure ran
            lbfgs.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            return loss

        lbfgs.step(closure)
    assert [c["grads_reach_what_ran"] for c in _contracts(tmp_path, OPTIMIZER_STEP)] == [True, True, False, True, True]


def test_a_part_that_never_had_a_gradient_is_in_a_phase_of_its_own_until_it_has_one(tmp_path):
    """An actor that only samples actions while its critic warms up runs with gradients
    and gets none (encode-attend-navigate's critic warm-up); once trained, a cut is seen."""
    torch.manual_seed(0)
    actor, critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 3)), nn.Linear(4, 1)
    optimizer = torch.optim.Adam(list(actor.parameters()) + list(critic.parameters()), lr=1e-3)
    with producers.instrument(run_id="r-warmup", trace_dir=tmp_path, quiet=True):
        for phase in ("warm-up", "warm-up", "joint", "joint", "cut"):
            states = torch.randn(8, 4)
            log_probs = torch.log_softmax(actor(states), -1)
            actions = torch.distributions.Categorical(logits=log_probs).sample()
            value = critic(states).squeeze(1)
            returns = actions.float()
            loss = F.mse_loss(value, returns)
            if phase != "warm-up":
                chosen = log_probs.gather(1, actions[:, None]).squeeze(1)
                loss = loss - ((returns - value.detach()) * (chosen.detach() if phase == "cut" else chosen)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert [c["grads_reach_what_ran"] for c in _contracts(tmp_path, OPTIMIZER_STEP)] == [True, True, True, True, False]


def test_an_optimizer_rebuilt_after_restoring_the_model_from_a_checkpoint_keeps_the_contract(tmp_path):
    """A restart from a checkpoint that kept no optimizer state (in the same process, as
    after a detected fault) starts over on purpose, whichever comes first: the restore
    or the new optimizers (two of them, stepping in turn, as in a GAN)."""
    generator, critic = _model(), _model()
    checkpoint = {k: v.clone() for k, v in generator.state_dict().items()}
    critic_checkpoint = {k: v.clone() for k, v in critic.state_dict().items()}

    def step(optimizer, model):
        optimizer.zero_grad()
        _backward(model)
        optimizer.step()

    with producers.instrument(run_id="r-resume", trace_dir=tmp_path, quiet=True):
        first = (torch.optim.Adam(generator.parameters(), lr=1e-2), torch.optim.Adam(critic.parameters(), lr=1e-2))
        for _ in range(2):
            step(first[0], generator)
            step(first[1], critic)
        for order in ("restore first", "build first"):
            if order == "restore first":
                generator.load_state_dict(checkpoint)
                critic.load_state_dict(critic_checkpoint)
            pair = (torch.optim.Adam(generator.parameters(), lr=1e-2), torch.optim.Adam(critic.parameters(), lr=1e-2))
            if order == "build first":
                generator.load_state_dict(checkpoint)
                critic.load_state_dict(critic_checkpoint)
            for _ in range(2):
                step(pair[0], generator)
                step(pair[1], critic)
    kept = [c["keeps_optimizer_state"] for c in _contracts(tmp_path, OPTIMIZER_STEP)]
    assert len(kept) == 12 and all(kept)


def test_an_optimizer_rebuilt_after_rewinding_the_weights_by_hand_keeps_the_contract(tmp_path):
    """The lottery-ticket recipe copies the initial weights back in place (masked) and
    builds a new optimizer for each round: a restart on purpose, like a restore."""
    model = _model()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}

    def steps(optimizer):
        for _ in range(2):
            optimizer.zero_grad()
            _backward(model)
            optimizer.step()

    with producers.instrument(run_id="r-rewind", trace_dir=tmp_path, quiet=True):
        steps(torch.optim.Adam(model.parameters(), lr=1e-2))
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(initial[name] * (param.abs() > 1e-3))
        steps(torch.optim.Adam(model.parameters(), lr=1e-2))
        steps(torch.optim.Adam(model.parameters(), lr=1e-2))  # no rewind this time: state thrown away
    assert _step_contracts(tmp_path) == [True, True, True, True, False, True]


def test_a_reset_where_a_part_of_the_model_starts_to_train_is_a_new_phase(tmp_path):
    """Progressive growing resets Adam over the same parameters when the next block starts
    to run (its gradients appear for the first time); an unused head never counts."""
    stem, grown, unused = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)
    params = [*stem.parameters(), *grown.parameters(), *unused.parameters()]

    def steps(optimizer, active: bool, count: int = 2) -> None:
        for _ in range(count):
            optimizer.zero_grad()
            hidden = stem(torch.randn(8, 4))
            (grown(hidden) if active else hidden).pow(2).mean().backward()
            optimizer.step()

    with producers.instrument(run_id="r-grow", trace_dir=tmp_path, quiet=True):
        steps(torch.optim.Adam(params, lr=1e-2), active=False)
        steps(torch.optim.Adam(params, lr=1e-2), active=True)  # the new block starts: reset on purpose
        steps(torch.optim.Adam(params, lr=1e-2), active=True)  # rebuilt again, nothing new: the bug
    assert _step_contracts(tmp_path) == [True, True, True, True, False, True]


def test_a_peek_at_the_first_batch_before_set_epoch_is_not_the_epochs_pass(tmp_path):
    """PyTorch's DDP tutorial reads the batch size with ``next(iter(loader))`` before it
    calls ``set_epoch``: the pass that training consumes is the one judged."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train, sampler = _loader(shuffle=True)
    with producers.instrument(run_id="r-peek", trace_dir=tmp_path, quiet=True):
        for epoch in range(3):
            len(next(iter(train))[0])
            sampler.set_epoch(epoch)
            for (x,) in train:
                optimizer.zero_grad()
                model(x).pow(2).mean().backward()
                optimizer.step()
    assert _contracts(tmp_path, DATALOADER_EPOCH) == [{"reshuffles_each_epoch": True}] * 3


def test_a_training_pass_carries_its_samplers_seed_for_the_cross_rank_rule(tmp_path):
    """PyTorch requires a ``DistributedSampler``'s seed to be identical across processes:
    each rank takes its slice of one permutation, so ranks seeded apart draw overlapping
    shards (mlcommons/training PR 625).  The seed travels with the pass."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(16, 4))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=7 + 1)
    with producers.instrument(run_id="r-seed", trace_dir=tmp_path, quiet=True):
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for (x,) in DataLoader(data, batch_size=4, sampler=sampler):
                optimizer.zero_grad()
                model(x).pow(2).mean().backward()
                optimizer.step()
    passes = [event for _, event in trace_events(trace_batches(tmp_path))
              if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == DATALOADER_EPOCH]
    assert [event["args"] for event in passes] == [{"sampler_seed": 8}] * 2


@pytest.mark.parametrize("number", [float, np.float64], ids=["float", "numpy"])
def test_steps_at_a_zero_learning_rate_after_learning_break_the_contract_from_the_second_one(tmp_path, number):
    """Rates written as NumPy scalars (schedules computed as arrays, DINO's
    ``cosine_scheduler``) are read like floats."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # warm-up from zero, two steps of learning, a schedule that ends after step 3
    rates = [number(rate) for rate in (0.0, 0.0, 1e-3, 5e-4, 0.0, 0.0, 0.0, 1e-3, 0.0)]
    capturable = torch.optim.Adam(_model().parameters(), lr=torch.tensor(0.0))
    with producers.instrument(run_id="r-lr", trace_dir=tmp_path, quiet=True):
        for rate in rates:
            for group in optimizer.param_groups:
                group["lr"] = rate
            optimizer.zero_grad()
            _backward(model)
            optimizer.step()
        capturable.step()  # a tensor rate is not read (it may live on an accelerator)
    kept = [c["keeps_learning"] for c in _contracts(tmp_path, OPTIMIZER_STEP)]
    assert kept == [True, True, True, True, True, False, False, True, True, None]


def _kept_weights(tmp_path) -> list:
    return [c["keeps_trained_weights"] for c in _contracts(tmp_path, OPTIMIZER_STEP)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        _backward(model)
        optimizer.step()


def test_trained_weights_loaded_back_to_their_initial_values_break_the_contract_at_the_next_step(tmp_path):
    """The "load the pretrained tower" line inside the epoch loop: from the second epoch
    the weights start over while Adam keeps its moments."""
    model = _model()
    initial = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with producers.instrument(run_id="r-rewind", trace_dir=tmp_path, quiet=True):
        for _ in range(3):
            model.load_state_dict(initial)
            _train(model, optimizer, 2)
    assert _kept_weights(tmp_path) == [True, True, False, True, False, True]


def test_restores_that_do_not_rewind_trained_weights_under_a_stateful_optimizer_keep_the_contract(tmp_path):
    model = _model()
    initial = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    frozen = _model()
    frozen[0].requires_grad_(False)
    frozen_initial = copy.deepcopy(frozen[0].state_dict())
    frozen_optimizer = torch.optim.AdamW(frozen.parameters(), lr=1e-2)
    plain = torch.optim.SGD(model.parameters(), lr=1e-2)
    with producers.instrument(run_id="r-restores", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, 2)
        best = copy.deepcopy(model.state_dict())
        _train(model, optimizer, 2)
        model.load_state_dict(best)  # a rollback to a later checkpoint
        _train(model, optimizer, 1)
        started = copy.deepcopy(optimizer.state_dict())
        model.load_state_dict(initial)  # an LR finder's reset: the optimizer's state comes back too
        optimizer.load_state_dict(started)
        _train(model, optimizer, 1)
        model.load_state_dict(initial)  # a new fold: a new optimizer
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        _train(model, optimizer, 2)
        model.load_state_dict(initial)  # an optimizer that keeps no state
        _train(model, plain, 1)
        _train(frozen, frozen_optimizer, 2)
        frozen[0].load_state_dict(frozen_initial)  # the frozen part reloaded: it never moved
        _train(frozen, frozen_optimizer, 1)
    assert _kept_weights(tmp_path) == [True] * 12


def _unfrozen(tmp_path) -> list:
    return [c["optimizes_unfrozen"] for c in _contracts(tmp_path, OPTIMIZER_STEP)]


def test_layers_unfrozen_after_an_optimizer_over_trainable_parameters_was_built_break_the_contract_once(tmp_path):
    """Hugging Face Trainer's optimizer holds only what was trainable when it was built:
    a gradual-unfreezing callback makes the backbone take gradients nothing applies."""
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with producers.instrument(run_id="r-unfreeze", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, 2)
        model[0].requires_grad_(True)
        _train(model, optimizer, 3)
    assert _unfrozen(tmp_path) == [True, True, False, True, True]


def test_unfreezing_into_an_optimizer_and_freezing_a_discriminator_per_update_keep_the_contract(tmp_path):
    model = _model()
    model[0].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    everything = _model()
    everything[0].requires_grad_(False)
    held_from_start = torch.optim.SGD(everything.parameters(), lr=1e-2, momentum=0.9)
    generator, critic = _model(), nn.Sequential(nn.Linear(1, 4), nn.ReLU(), nn.Linear(4, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-unfreeze-ok", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, 1)
        model[0].requires_grad_(True)
        optimizer.add_param_group({"params": list(model[0].parameters()), "lr": 1e-4})
        _train(model, optimizer, 1)
        _train(everything, held_from_start, 1)
        everything[0].requires_grad_(True)
        _train(everything, held_from_start, 1)
        for _ in range(2):  # CycleGAN's set_requires_grad(netD, False) around the generator's update
            critic.requires_grad_(False)
            opt_g.zero_grad()
            critic(generator(torch.randn(8, 4))).mean().backward()
            opt_g.step()
            critic.requires_grad_(True)
            opt_c.zero_grad()
            critic(generator(torch.randn(8, 4)).detach()).mean().backward()
            opt_c.step()
    assert _unfrozen(tmp_path) == [True] * 8


def _norm_contracts(tmp_path) -> list:
    return [c["frozen_norm_keeps_stats"] for c in _contracts(tmp_path, "torch.nn.Module.forward") if c]


def test_a_frozen_batchnorm_left_in_training_mode_breaks_the_contract_on_each_forward(tmp_path):
    backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
    head = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.01, momentum=0.9)
    key_encoder = copy.deepcopy(backbone).requires_grad_(False)
    plain_norm = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, affine=False))
    with producers.instrument(run_id="r-frozen-bn", trace_dir=tmp_path, quiet=True):
        for step in range(4):
            if step == 2:
                backbone.requires_grad_(False)  # linear probing: frozen, but never put in eval()
            optimizer.zero_grad()
            head(backbone(torch.randn(8, 4))).pow(2).mean().backward()
            optimizer.step()
            with torch.no_grad():  # a momentum encoder in training mode without gradients: by design
                key_encoder(torch.randn(8, 4))
            plain_norm(torch.randn(8, 4))  # no affine parameters: nothing to freeze
            if step == 1:  # linear probing: a new optimizer over the head alone
                optimizer = torch.optim.SGD(head.parameters(), lr=0.01, momentum=0.9)
        backbone.eval()  # the healthy probe: frozen and in eval mode
        head(backbone(torch.randn(8, 4))).pow(2).mean().backward()
        generator = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
        critic = nn.Linear(4, 1)
        opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
        opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
        for _ in range(2):  # Lightning's toggle_optimizer: the generator frozen during the critic's update
            generator.requires_grad_(False)
            opt_c.zero_grad()
            critic(generator(torch.randn(8, 4))).mean().backward()
            opt_c.step()
            generator.requires_grad_(True)
            opt_g.zero_grad()
            critic(generator(torch.randn(8, 4))).mean().backward()
            opt_g.step()
    assert _norm_contracts(tmp_path) == [True, True, False, False, True, True]


def test_a_teacher_loaded_from_the_student_runs_its_batchnorm_in_training_mode_by_design(tmp_path):
    """DINO builds its EMA teacher on its own, loads it from the student's state dict and
    runs it in training mode with gradients enabled: a weight average, not a frozen
    backbone.  A backbone loaded from a checkpoint's tensors and left in train() is."""
    def network():
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    student, teacher, probe_backbone = network(), network(), network()
    head = nn.Linear(2, 1)
    with producers.instrument(run_id="r-teacher-bn", trace_dir=tmp_path, quiet=True):
        teacher.load_state_dict(student.state_dict())
        teacher.requires_grad_(False)
        probe_backbone.load_state_dict({k: v.clone() for k, v in student.state_dict().items()})
        probe_backbone.requires_grad_(False)
        optimizer = torch.optim.SGD(list(student.parameters()) + list(head.parameters()), lr=0.01)
        for _ in range(2):
            optimizer.zero_grad()
            target = teacher(torch.randn(8, 4)).softmax(-1)  # no torch.no_grad(), as DINO
            (student(torch.randn(8, 4)).log_softmax(-1) * target).sum().backward()
            head(probe_backbone(torch.randn(8, 4))).mean().backward()
            optimizer.step()
    assert _norm_contracts(tmp_path) == [True, False, True, False]


def test_a_batchnorm_frozen_inside_a_model_whose_optimizer_trains_the_rest_breaks_it(tmp_path):
    """gt-pyg issue 112: the encoder is frozen (``requires_grad=False``, BatchNorm put in
    eval) after the optimizer was built over ``model.parameters()``; the next
    ``model.train()`` puts the BatchNorm back in training mode.  The optimizer still
    trains the head, so it is no network switched off for another one's update."""
    encoder = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
    model = nn.Sequential(encoder, nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-frozen-bn-held", trace_dir=tmp_path, quiet=True):
        for step in range(4):
            if step == 2:
                encoder.requires_grad_(False)
                encoder[1].eval()
            model.train()
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
    assert _norm_contracts(tmp_path) == [True, True, False, False]


def test_batchnorm_weights_unfrozen_beside_the_block_lightning_adds_keep_the_contract(tmp_path):
    """``unfreeze_and_add_param_group(..., train_bn=False)``: the block's convolution joins
    the optimizer, its BatchNorm weights take gradients no optimizer holds, on purpose."""
    block = nn.Sequential(nn.Linear(4, 64), nn.BatchNorm1d(64), nn.ReLU())
    head = nn.Linear(64, 1)
    model = nn.Sequential(block, head)
    block.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    with producers.instrument(run_id="r-unfreeze-bn", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, 1)
        block.requires_grad_(True)
        optimizer.add_param_group({"params": list(block[0].parameters())})
        _train(model, optimizer, 1)
    assert _unfrozen(tmp_path) == [True, True]
