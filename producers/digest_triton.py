"""The fused device-digest kernel (Triton). Imported only on a CUDA device, by
`producers.digest_kernel`, which checks it against the torch-op reference before use."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
_MIX1 = tl.constexpr(0xBF58476D1CE4E5B9)
_MIX2 = tl.constexpr(0x94D049BB133111EB)
_SECOND_SEED = tl.constexpr(0x2545F4914F6CDD1D)
#: Elements per program: few launches, still many programs in flight on any GPU.
BLOCK = 4096


@triton.jit
def _mix(values):
    """splitmix64 finaliser in uint64 (wrapping multiply, logical shifts)."""
    values = values ^ (values >> 30)
    values = values * _MIX1
    values = values ^ (values >> 27)
    values = values * _MIX2
    return values ^ (values >> 31)


@triton.jit
def _digest_blocks(x_ptr, partial_ptr, n, MASK: tl.constexpr, BLOCK: tl.constexpr):
    """Per block, the wrapping sums of both words: element bits keyed by position and
    mixed once, then mixed again alone (first word) and with a second seed (second)."""
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    value = tl.load(x_ptr + offsets, mask=valid, other=0).to(tl.int64)
    if MASK != 0:
        value = value & MASK
    keyed = _mix(offsets.to(tl.uint64) * _GOLDEN + value.to(tl.uint64, bitcast=True))
    zero = tl.zeros_like(keyed)
    first = tl.sum(tl.where(valid, _mix(keyed), zero), axis=0)
    second = tl.sum(tl.where(valid, _mix(keyed + tl.full(keyed.shape, _SECOND_SEED, tl.uint64)), zero), axis=0)
    tl.store(partial_ptr + pid * 2, first.to(tl.int64, bitcast=True))
    tl.store(partial_ptr + pid * 2 + 1, second.to(tl.int64, bitcast=True))


def digest_words(raw: torch.Tensor) -> torch.Tensor:
    """Two int64 words of a flat integer CUDA tensor, equal to the torch-op reference."""
    count = raw.numel()
    if count == 0:
        return torch.zeros(2, dtype=torch.int64, device=raw.device)
    blocks = triton.cdiv(count, BLOCK)
    partial = torch.empty((blocks, 2), dtype=torch.int64, device=raw.device)
    mask = 0 if raw.dtype in (torch.uint8, torch.int64) else (1 << (8 * raw.element_size())) - 1
    _digest_blocks[(blocks,)](raw, partial, count, MASK=mask, BLOCK=BLOCK)
    return partial.sum(dim=0)
