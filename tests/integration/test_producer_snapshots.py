"""Snapshot summaries reused across points stay correct when gradients change."""

from __future__ import annotations

import torch

from producers.digest import tensor_digest
from producers.param_snapshots import SnapshotMemo, snapshot_attrs
from producers.params import ParameterRegistry


def _grad_attrs(registry: ParameterRegistry, memo: SnapshotMemo) -> dict[str, tuple[str | None, float | None]]:
    return {
        entry.name: (attrs["grad_digest"], attrs["grad_norm"])
        for entry, attrs in snapshot_attrs(registry.all_entries(), data=False, memo=memo)
    }


def test_reused_gradient_summaries_follow_every_change_made_through_the_tensor():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    model(torch.randn(5, 4)).sum().backward()
    registry, memo = ParameterRegistry(), SnapshotMemo()
    registry.add_root(model)

    first = _grad_attrs(registry, memo)
    assert first == _grad_attrs(registry, memo)  # unchanged: same summaries
    assert first["weight"][0] == tensor_digest(model.weight.grad)

    model.weight.grad.div_(2)  # in place, as a manual all-reduce average does
    after_div = _grad_attrs(registry, memo)
    assert after_div["weight"] != first["weight"] and after_div["bias"] == first["bias"]
    assert after_div["weight"][0] == tensor_digest(model.weight.grad)
    assert abs(after_div["weight"][1] - first["weight"][1] / 2) < 1e-6

    model(torch.randn(5, 4)).sum().backward()  # accumulation into the same tensors
    accumulated = _grad_attrs(registry, memo)
    assert accumulated["weight"][0] == tensor_digest(model.weight.grad) != after_div["weight"][0]

    model.bias.grad = model.bias.grad.clone()  # a new object with equal values
    assert _grad_attrs(registry, memo)["bias"] == accumulated["bias"]
    model.zero_grad(set_to_none=True)
    assert all(value == (None, None) for value in _grad_attrs(registry, memo).values())


def test_parameter_data_is_digested_afresh_even_when_written_through_data():
    model = torch.nn.Linear(2, 2)
    registry, memo = ParameterRegistry(), SnapshotMemo()
    registry.add_root(model)
    before = {e.name: a["data_digest"] for e, a in snapshot_attrs(registry.all_entries(), memo=memo)}
    model.weight.data.add_(1e-3)  # invisible to the version counter
    after = {e.name: a["data_digest"] for e, a in snapshot_attrs(registry.all_entries(), memo=memo)}
    assert after["weight"] != before["weight"] and after["bias"] == before["bias"]
