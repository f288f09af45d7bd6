"""The device digest as one fused kernel on CUDA (Triton), with torch ops as the reference.

`producers.digest.device_digest_words` mixes each element with torch ops: a dozen
elementwise kernels per 2 M-element chunk and parameter, each a full pass over int64
temporaries.  On a GPU a snapshot of a model with many parameters becomes thousands of
tiny launches (35–45 ms per step for a 34 M-parameter MLP on an H200, against a 3 ms
step).  This kernel computes the same two words in one read of the tensor: per block a
wrapping sum of the mixed elements, then one sum over blocks.  The arithmetic is the
reference's, in uint64 (wrapping multiply, logical shifts), so the words are equal bit
for bit; that is checked once per process on a probe of every integer width before the
kernel is trusted, and any failure (no Triton, a compile error, a mismatch) keeps the
torch ops for the rest of the process.  ``TRAINWATCH_DIGEST_KERNEL=torch`` opts out.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

import torch

_state: dict[str, Any] = {"kernel": None, "checked": False}


def _probe(words: Callable[[torch.Tensor], torch.Tensor], reference: Callable[[torch.Tensor], torch.Tensor],
           device: torch.device) -> bool:
    """The kernel agrees with the reference on every integer width, odd sizes included."""
    generator = torch.Generator(device="cpu").manual_seed(7)
    cases = [
        torch.randint(-(2**62), 2**62, (5000,), generator=generator, dtype=torch.int64),
        torch.randint(-(2**31), 2**31 - 1, (4099,), generator=generator, dtype=torch.int32),
        torch.randint(-(2**15), 2**15 - 1, (17,), generator=generator, dtype=torch.int16),
        torch.randint(-128, 127, (9000,), generator=generator, dtype=torch.int8),
        torch.randint(0, 255, (3,), generator=generator, dtype=torch.uint8),
    ]
    for case in cases:
        raw = case.to(device)
        if not torch.equal(words(raw).cpu(), reference(raw).cpu()):
            return False
    return True


def fused_words(raw: torch.Tensor, reference: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor | None:
    """The digest words of a flat integer CUDA tensor by the fused kernel, or None when
    the kernel is not available here (the caller then uses ``reference``)."""
    if raw.device.type != "cuda":
        return None
    if not _state["checked"]:
        _state["checked"] = True
        if os.environ.get("TRAINWATCH_DIGEST_KERNEL", "").lower() == "torch":
            return None
        try:
            kernel = importlib.import_module("producers.digest_triton").digest_words
            if _probe(kernel, reference, raw.device):
                _state["kernel"] = kernel
            else:
                print("trainwatch: the fused digest kernel disagrees with the reference here; "
                      "digests use torch ops", file=sys.stderr)
        except Exception as exc:  # no Triton, or it cannot compile for this device
            print(f"trainwatch: digests use torch ops (fused kernel unavailable: {type(exc).__name__})",
                  file=sys.stderr)
    kernel = _state["kernel"]
    return kernel(raw) if kernel is not None else None
