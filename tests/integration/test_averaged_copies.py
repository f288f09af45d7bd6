"""``updates_move_average`` and ``averages_once_per_step``: a deep copy of trained weights
that the program averages into (an EMA) moves when written, and is averaged once per
optimizer step.  A bf16 EMA's updates round to nothing (sd_dreambooth_extension PR 1415);
an EMA updated on every micro-batch decays several times too fast (F5-TTS#631)."""

from __future__ import annotations

import copy

import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from producers.averaged_copies import AveragedCopies
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path, contract: str) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(contract)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _ema_step(ema: nn.Module, model: nn.Module, decay: float) -> None:
    with torch.no_grad():
        for averaged, live in zip(ema.parameters(), model.parameters()):
            averaged.sub_((1 - decay) * (averaged - live.to(averaged.dtype)))


def _train(tmp_path, *, steps: int = 6, dtype=torch.float32, micro_batches: int = 1, ema_per_micro_batch=False,
           decay: float = 0.995, copy_only: bool = False, ema_from: int = 0, write_through_data=False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    ema = None
    with producers.instrument(run_id="r-ema", trace_dir=tmp_path, quiet=True):
        for step in range(steps):
            if step == ema_from:
                ema = copy.deepcopy(model).requires_grad_(False).to(dtype)
            for micro in range(micro_batches):
                (model(torch.randn(8, 16)).pow(2).mean() / micro_batches).backward()
                if ema is not None and ema_per_micro_batch and micro < micro_batches - 1:
                    _ema_step(ema, model, decay)
            optimizer.step()
            optimizer.zero_grad()
            if ema is None:
                continue
            if copy_only:
                ema.load_state_dict(model.state_dict())
            elif write_through_data:
                for averaged, live in zip(ema.parameters(), model.parameters()):
                    averaged.data.mul_(decay).add_(live.data.to(dtype), alpha=1 - decay)
            else:
                _ema_step(ema, model, decay)
    return ema


def test_a_float32_average_keeps_both_contracts(tmp_path):
    _train(tmp_path)
    assert _verdicts(tmp_path, "updates_move_average") == [None, True, True, True, True, True]
    assert _verdicts(tmp_path, "averages_once_per_step") == [None, True, True, True, True, True]


def test_a_bf16_average_whose_updates_round_to_nothing_is_reported_at_its_first_update(tmp_path):
    _train(tmp_path, dtype=torch.bfloat16, ema_from=2)
    assert _verdicts(tmp_path, "updates_move_average") == [None, None, None, False, False, False]


def test_an_average_updated_on_every_micro_batch_is_reported(tmp_path):
    _train(tmp_path, micro_batches=3, ema_per_micro_batch=True)
    verdicts = _verdicts(tmp_path, "averages_once_per_step")
    assert verdicts[0] is None and False in verdicts[1:3]


def test_per_step_averages_with_accumulation_keep_the_contract(tmp_path):
    _train(tmp_path, micro_batches=3)
    assert _verdicts(tmp_path, "averages_once_per_step") == [None, True, True, True, True, True]


def test_a_plain_copy_in_bf16_is_no_average_and_is_not_judged_stuck(tmp_path):
    """A target network loaded from the live weights equals them after each write."""
    _train(tmp_path, dtype=torch.bfloat16, copy_only=True)
    assert False not in _verdicts(tmp_path, "updates_move_average")


def test_writes_through_data_are_not_seen_and_not_judged(tmp_path):
    _train(tmp_path, dtype=torch.bfloat16, write_through_data=True)
    assert _verdicts(tmp_path, "updates_move_average") == [None] * 6


def test_copies_held_by_an_optimizer_are_trained_models_not_averages():
    held: set[int] = set()

    class Holdings:
        holdings_changed = 0

        @staticmethod
        def held_by_optimizer(tensor):
            return id(tensor) in held

        @staticmethod
        def optimized_parameters():
            return []

    copies = AveragedCopies(Holdings())
    handles = copies.install()
    try:
        model = nn.Linear(8, 8)
        held.update(id(p) for p in model.parameters())
        second = copy.deepcopy(model)
        assert len(list(copies._watched())) == 2
        held.update(id(p) for p in second.parameters())  # an optimizer over the copy: a second model
        assert list(copies._watched()) == []
    finally:
        for handle in handles:
            handle.remove()
    assert nn.Parameter.__deepcopy__ is not None and copy.deepcopy(nn.Linear(2, 2)) is not None


def test_deepcopy_of_a_parameter_goes_through_parameter_deepcopy():
    """The copy relation rests on torch calling ``Parameter.__deepcopy__`` for each
    parameter of a deep-copied module (private behaviour, pinned here)."""
    seen = []
    original = nn.Parameter.__deepcopy__

    def spy(self, memo):
        seen.append(self)
        return original(self, memo)

    nn.Parameter.__deepcopy__ = spy
    try:
        model = nn.Linear(3, 3)
        copied = copy.deepcopy(model)
    finally:
        nn.Parameter.__deepcopy__ = original
    assert [id(p) for p in seen] == [id(p) for p in model.parameters()]
    assert all(isinstance(p, nn.Parameter) for p in copied.parameters())
