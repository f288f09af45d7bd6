"""Tensor digests: every element counts, equal values agree, algorithms never collide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from producers import digest
from producers.digest import tensor_digest, tensor_digests

BOTH_PATHS = pytest.mark.parametrize("on_device", [False, True], ids=["xxh3", "device-path"])


@BOTH_PATHS
def test_equal_tensors_have_equal_digests_and_one_ulp_changes_it(on_device):
    a = torch.randn(257, 3)
    b = a.clone()
    assert tensor_digest(a, on_device=on_device) == tensor_digest(b, on_device=on_device)
    b[100, 1] = torch.nextafter(b[100, 1], torch.tensor(float("inf")))
    assert tensor_digest(a, on_device=on_device) != tensor_digest(b, on_device=on_device)


@BOTH_PATHS
def test_position_matters_not_just_the_multiset_of_values(on_device):
    a = torch.arange(64, dtype=torch.float32)
    swapped = a.clone()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert tensor_digest(a, on_device=on_device) != tensor_digest(swapped, on_device=on_device)


@BOTH_PATHS
def test_dtype_and_shape_are_part_of_the_value(on_device):
    a = torch.zeros(4, 6)
    assert tensor_digest(a, on_device=on_device) != tensor_digest(a.reshape(6, 4), on_device=on_device)
    assert tensor_digest(a, on_device=on_device) != tensor_digest(a.to(torch.int32), on_device=on_device)


@BOTH_PATHS
def test_non_contiguous_views_digest_their_logical_values(on_device):
    base = torch.randn(8, 5)
    view = base.t()
    assert not view.is_contiguous()
    assert tensor_digest(view, on_device=on_device) == tensor_digest(view.contiguous(), on_device=on_device)
    assert tensor_digest(view, on_device=on_device) != tensor_digest(base, on_device=on_device)


@BOTH_PATHS
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(7, dtype=torch.bfloat16),
        lambda: torch.randn(7, dtype=torch.float16),
        lambda: torch.randn(7, dtype=torch.float64),
        lambda: torch.randn(3, dtype=torch.complex64),
        lambda: torch.randn(3, dtype=torch.complex128),
        lambda: torch.tensor([True, False, True]),
        lambda: torch.arange(-5, 5, dtype=torch.int8),
        lambda: torch.arange(9, dtype=torch.int64),
        lambda: torch.tensor(2.5),
        lambda: torch.zeros(0, 3),
    ],
    ids=["bf16", "fp16", "fp64", "c64", "c128", "bool", "int8", "int64", "0-dim", "empty"],
)
def test_every_dtype_and_odd_shape_is_digested(make, on_device):
    tensor = make()
    first = tensor_digest(tensor, on_device=on_device)
    assert first is not None and first.startswith("dv:" if on_device else "x3:")
    assert tensor_digest(tensor.clone(), on_device=on_device) == first
    if tensor.numel():
        changed = tensor.clone()
        flat = changed.view(-1)
        flat[0] = flat[0] + 1 if tensor.dtype != torch.bool else ~flat[0]
        assert tensor_digest(changed, on_device=on_device) != first


def test_conjugate_and_negative_views_are_resolved():
    z = torch.randn(4, dtype=torch.complex64)
    assert tensor_digest(z.conj()) == tensor_digest(z.conj().resolve_conj())
    assert tensor_digest(z.conj(), on_device=True) == tensor_digest(z.conj().resolve_conj(), on_device=True)


def test_tensors_without_data_get_none_and_a_reason():
    meta = torch.empty(3, 4, device="meta")
    assert tensor_digest(meta) is None
    assert tensor_digest(meta, on_device=True) is None
    assert digest.skip_reason(meta) == "meta"
    sparse = torch.eye(3).to_sparse()
    assert tensor_digest(sparse) is None and digest.skip_reason(sparse) == "layout"


def test_a_tensor_whose_storage_was_freed_is_skipped_not_read():
    """FSDP2 frees an unsharded parameter between uses by resizing its storage to zero
    bytes; the tensor keeps its shape, and reading it would fault the process."""
    from producers.param_snapshots import tensor_norms

    freed = torch.randn(64)
    freed.untyped_storage().resize_(0)
    assert digest.skip_reason(freed) == "freed"
    assert tensor_digests([freed, torch.ones(3)])[0] is None
    assert tensor_norms([freed, torch.ones(4)]) == [None, 2.0]


def test_algorithms_are_prefixed_so_they_never_compare_equal():
    t = torch.randn(10)
    cpu, dev = tensor_digest(t), tensor_digest(t, on_device=True)
    assert cpu.split(":")[0] == "x3" and dev.split(":")[0] == "dv"
    assert cpu != dev


def test_cpu_digest_does_not_copy_contiguous_tensors(monkeypatch):
    copies = []
    original = torch.Tensor.contiguous

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if out.data_ptr() != self.data_ptr():
            copies.append(self.shape)
        return out

    monkeypatch.setattr(torch.Tensor, "contiguous", spy)
    tensor_digest(torch.randn(1000, 100))
    assert copies == []


def test_device_path_is_independent_of_chunking(monkeypatch):
    t = torch.randn(1000)
    whole = tensor_digest(t, on_device=True)
    monkeypatch.setattr(digest, "_DEVICE_CHUNK", 77)  # many chunks with a ragged tail
    assert tensor_digest(t, on_device=True) == whole


@BOTH_PATHS
def test_batch_digests_match_single_ones(on_device):
    tensors = [torch.randn(5), None, torch.empty(2, device="meta"), torch.ones(3, dtype=torch.bool)]
    batch = tensor_digests(tensors, on_device=on_device)
    assert batch == [tensor_digest(tensors[0], on_device=on_device), None, None, tensor_digest(tensors[3], on_device=on_device)]


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=64),
    index=st.integers(min_value=0, max_value=63),
)
def test_property_any_single_element_change_is_seen(values, index):
    a = torch.tensor(np.array(values, dtype=np.float32))
    b = a.clone()
    i = index % a.numel()
    bits = b.view(torch.int32)
    bits[i] ^= 1  # flip the lowest mantissa bit
    for on_device in (False, True):
        assert tensor_digest(a, on_device=on_device) != tensor_digest(b, on_device=on_device)
        assert tensor_digest(a, on_device=on_device) == tensor_digest(a.clone(), on_device=on_device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_and_cpu_run_the_same_device_algorithm():
    t = torch.randn(4097, 3)
    assert tensor_digest(t.cuda()) == tensor_digest(t, on_device=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_fused_cuda_kernel_gives_the_reference_words_for_every_dtype_and_size():
    from producers import digest_kernel
    from producers.digest import _as_integers, _plain, device_digest_words, reference_words

    digest_kernel._state.update(kernel=None, checked=False)
    generator = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64,
                  torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool):
        for count in (0, 1, 4095, 4096, 4097, 3_000_001):
            values = torch.randn(count, generator=generator) * 100
            tensor = (values > 0 if dtype == torch.bool else values.to(dtype)).cuda()
            words = device_digest_words(tensor)
            assert torch.equal(words.cpu(), reference_words(_as_integers(_plain(tensor))).cpu()), (dtype, count)
    transposed = torch.randn(300, 70, generator=generator).cuda().t()
    assert torch.equal(device_digest_words(transposed).cpu(),
                       reference_words(_as_integers(_plain(transposed))).cpu())
    assert digest_kernel._state["kernel"] is not None, "the fused kernel was not used"
