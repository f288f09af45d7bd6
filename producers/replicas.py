"""Ranks that never synchronise gradients are not replicas.

The cross-rank rules on parameters read several ranks as copies of one model, which
every data-parallel program keeps in sync by reducing gradients at each step: DDP's
reducer (and the wrappers built on it: Lightning's and accelerate's strategies),
FSDP, DeepSpeed's engine, or a hand-written ``all_reduce`` of the gradients between
the backward and the optimizer step.  Programs that run one process per rank without
any of that train separate models on purpose: federated averaging (each rank trains
its clients' local copies and the ranks average parameters every round), ensembles,
one seed per process.  Their ranks part at the first update, which is what a skipped
all-reduce looks like, so comparing them reports every step.

So a process counts as a replica once it has shown a gradient synchronisation: a
DDP-like wrapper among its models, or a collective called after a backward and
before the optimizer step that follows (Horovod-style loops reduce there, also from
hooks inside the backward; a reduced scalar, a norm or a loss, is no synchronisation).
Until then its parameter snapshots carry the mark frameworks give parameters they do
not all-reduce (``parallel.allreduce = False``),
which the cross-rank rules leave out, and its calls carry ``ctx.separate``: what
their arguments hold (a pipeline stage's loss, its parameters to clip) is the model's
own, so agreeing across ranks is no rule for them.  The latch never resets: a replica that later
skips its reduction (a module called outside its DDP wrapper) is the bug the rules
are for.  Single-process runs are never marked.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .stages import wrapper_chain

#: wrappers whose forward sets up a gradient reduction across ranks, by class name so
#: that no optional framework is imported for the check
REPLICATING_WRAPPERS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "DeepSpeedEngine"})
#: collectives that move no gradients
NOT_REDUCING = frozenset({"torch.distributed.barrier", "torch.distributed.init_process_group"})


def _wraps_replicas(module: nn.Module) -> bool:
    """Whether ``module`` is, or wraps, a DDP-like wrapper (``torch.compile(DDP(model))``)."""
    return any(cls.__name__ in REPLICATING_WRAPPERS
               for wrapper in wrapper_chain(module) for cls in type(wrapper).__mro__)


def _scalar(moved: Any) -> bool:
    tensor = moved[0] if isinstance(moved, (list, tuple)) and moved else moved
    return isinstance(tensor, torch.Tensor) and tensor.numel() <= 1


def several_ranks() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class GradientSync:
    """Whether this process has synchronised gradients with other ranks yet."""

    def __init__(self) -> None:
        self.shown = False
        self._marked = False  # snapshots were marked (the process group may be gone at the end)

    def collective_called(self, api: str, backward_pending: bool, moved: Any) -> None:
        """``moved``: the collective's first argument.  A scalar reduced between the
        backward and the step is a gradient norm or a loss (pipeline stages clip by the
        norm of all stages' gradients), not a gradient synchronisation."""
        if backward_pending and api not in NOT_REDUCING and not _scalar(moved):
            self.shown = True

    def separate(self) -> bool:
        """For each recorded call: whether it is a separate model's (several ranks, no
        synchronisation shown yet), which cross-rank argument rules leave out."""
        return not self.shown and several_ranks()

    def separate_models(self) -> bool:
        """For the run's end: ranks that never showed a synchronisation trained separate
        models, and their parameters were compared across ranks nowhere."""
        return self._marked and not self.shown

    def is_replica(self, roots: Iterable[nn.Module]) -> bool:
        """Whether this process has shown a synchronisation, asking its models for a
        DDP-like wrapper while it has not."""
        if not self.shown and several_ranks() and any(_wraps_replicas(root) for root in roots):
            self.shown = True
        return self.shown

    def mark_unsynchronised(self, taken: list[tuple[Any, dict[str, Any]]], roots: Iterable[nn.Module]) -> None:
        """Give a snapshot's attributes the not-all-reduced mark while no gradient
        synchronisation was shown.  In place, like `local_sgd.mark_locally_stepped`: the
        ``parallel`` dict may be shared with the snapshot memo, so it is replaced."""
        if self.shown or not taken or not several_ranks():
            return
        if any(_wraps_replicas(root) for root in roots):
            self.shown = True
            return
        self._marked = True
        for _, attrs in taken:
            attrs["parallel"] = {**(attrs.get("parallel") or {}), "allreduce": False}
