"""Two parameters an optimizer holds that are one memory.

Tied weights (an embedding and the output projection of a language model) are one
``Parameter`` under two names, and optimizers step it once.  A checkpoint saved from
such a model holds one tensor under both keys, so ``load_state_dict(..., assign=True)``
(the meta-device fast init of torchtitan-style resumes) wraps that tensor in a new
``Parameter`` for each key: two parameters over the same memory (pytorch/pytorch
issue 188346).  An optimizer built over ``model.parameters()`` then steps that memory
twice per step, each time with moments of its own, and the tie looks intact because
the values stay identical.  Nothing fails; every update to the tied weight is doubled.

So each optimizer step carries the contract ``steps_each_memory_once``: no two
parameters the optimizer holds start at the same address with the same shape.
Parameters that are disjoint views of one flat buffer (contiguous gradient buffers,
flattened shards) start at different addresses and are fine; empty and meta tensors
are not judged.  The verdict is kept until the optimizer's parameter count changes
(an added param group), so a step costs one count, not one address read per parameter.
A sharded parameter (FSDP2's ``DTensor``) has no storage of its own and reports address
0: its local shard's address is read instead.
"""

from __future__ import annotations

import weakref

import torch


class SharedMemory:
    """Per optimizer: the parameter count its verdict was taken at, and the verdict."""

    def __init__(self) -> None:
        self._verdicts: "weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, bool]]" = (
            weakref.WeakKeyDictionary())

    def steps_each_memory_once(self, optimizer: torch.optim.Optimizer) -> bool:
        held = sum(len(group.get("params", ())) for group in optimizer.param_groups)
        known = self._verdicts.get(optimizer)
        if known is not None and known[0] == held:
            return known[1]
        verdict = not _aliased(optimizer)
        self._verdicts[optimizer] = (held, verdict)
        return verdict


def _aliased(optimizer: torch.optim.Optimizer) -> bool:
    """Whether two distinct parameters of ``optimizer`` start at one address with one shape."""
    seen: dict[tuple[str, int, tuple[int, ...]], int] = {}
    for group in optimizer.param_groups:
        for param in group.get("params", ()):
            if not isinstance(param, torch.Tensor) or param.is_meta or param.numel() == 0:
                continue
            local = param.to_local() if callable(getattr(param, "to_local", None)) else param
            address = local.data_ptr()
            if not address:
                continue
            key = (str(local.device), address, tuple(local.shape))
            if seen.setdefault(key, id(param)) != id(param):
                return True
    return False
