"""Replicas that differ on purpose: post-local SGD.

torch's post-local SGD (Lin et al. 2020: DDP's ``post_localSGD_hook`` with a
``PostLocalSGDState``, the parameters averaged every few steps by a
``PeriodicModelAverager`` or ``PostLocalSGDOptimizer``) all-reduces gradients across
the whole group only for its first ``start_localSGD_iter`` iterations.  After that each
rank, or each subgroup, steps on its own gradients, and the replicas differ until the
next averaging.  Cross-rank rules on parameters would read that as drift.

So from the iteration local SGD starts, the snapshots of such a DDP module's parameters
carry the mark frameworks give parameters they do not all-reduce (``parallel.allreduce
= False``, as DeepSpeed's expert parameters carry it).  The cross-rank rules already
leave those out.  The hook's state is recognised by its class name and the two counters
torch documents, so that ``torch.distributed.algorithms`` is never imported for it.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn

_STATE_CLASS = "PostLocalSGDState"


def _in_local_phase(state: Any) -> bool:
    if type(state).__name__ != _STATE_CLASS:
        return False
    started, start = getattr(state, "iter", None), getattr(state, "start_localSGD_iter", None)
    return isinstance(started, int) and isinstance(start, int) and started >= start


def mark_locally_stepped(taken: list[tuple[Any, dict[str, Any]]], roots: Iterable[nn.Module]) -> None:
    """Give the snapshot attributes of the parameters of DDP modules (among ``roots``)
    whose post-local SGD phase has begun the not-all-reduced mark.  In place: a value
    still on its way from an accelerator fills these very dicts later; the ``parallel``
    dict itself may be shared with the snapshot memo, so it is replaced."""
    local: set[int] = set()
    for root in roots:
        hooks = getattr(root, "_comm_hooks", None)  # DistributedDataParallel's registered (hook, state)s
        if hooks and isinstance(root, nn.parallel.DistributedDataParallel) and any(
                _in_local_phase(state) for _, state in hooks):
            local.update(id(param) for param in root.parameters())
    if not local:
        return
    for entry, attrs in taken:
        if id(entry.param) in local:
            attrs["parallel"] = {**(attrs.get("parallel") or {}), "allreduce": False}
