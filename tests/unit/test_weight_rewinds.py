"""Fingerprints of parameters on accelerators are compared as device words (no host
read when taken); the CPU path compares digests.  Both must tell equal values from
changed ones, and a reshape from the original."""

from __future__ import annotations

import torch

from producers.weight_rewinds import fingerprint, same


def _device_fingerprint(tensor: torch.Tensor):
    return fingerprint(tensor, on_device=True)


def test_device_words_fingerprints_tell_equal_values_from_changed_and_reshaped_ones():
    weights = torch.randn(4, 6)
    first = _device_fingerprint(weights)
    assert not isinstance(first, str)  # device words, kept where the tensor lives
    assert same(first, _device_fingerprint(weights.clone()))
    changed = weights.clone()
    changed[2, 3] += 1e-6
    assert not same(first, _device_fingerprint(changed))
    assert not same(first, _device_fingerprint(weights.reshape(6, 4)))


def test_cpu_fingerprints_are_digests_and_empty_tensors_have_none():
    weights = torch.nn.Parameter(torch.randn(3, 3))
    assert isinstance(fingerprint(weights), str)
    assert same(fingerprint(weights), fingerprint(weights.detach().clone()))
    assert fingerprint(torch.nn.Parameter(torch.empty(0))) is None
    assert fingerprint(torch.empty(2, device="meta")) is None
