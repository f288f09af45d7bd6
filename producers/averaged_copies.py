"""Weight averages (EMAs, momentum teachers) whose updates move nothing or run per micro-batch.

An exponential moving average is a deep copy of the trained model that the program
blends towards the live weights after each optimizer step.  Nothing in torch says
"EMA update", and two ways of getting it wrong raise nothing:

* kept in bf16 or fp16, ``(1 - decay) * (ema - p)`` is below half a unit in the last
  place of the copy, so every update rounds to nothing: the copy is written at every
  step and stays where it was made (sd_dreambooth_extension PR 1415);
* updated on every micro-batch of an accumulation loop, it averages several times per
  optimizer step and decays that many times too fast (F5-TTS#631).

Copies are known from ``Parameter.__deepcopy__`` (``copy.deepcopy(model)``,
``AveragedModel``, timm's ``ModelEma``, ema_pytorch) and from ``Module.load_state_dict``
of another model's live ``state_dict()`` (a teacher or target network built on its own
and loaded from the student, as DINO and DQN do).  Watched are the copies no
optimizer holds of parameters an optimizer holds; a write is seen through the copy's
version counter (writes through ``.data``, which has a counter of its own, are not seen
and not judged).  A write that leaves the copy equal to its source (a plain copy, a hard
target update) is not an average and is not judged.  Lost updates are judged on a few
tensors of bf16 or fp16 copies on the CPU: in single precision an update lost to
rounding is transient (the copy's lag grows until its updates register), in half
precision it is the rule.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .ownership import ParameterOwnership

#: copy tensors whose values are kept to judge their next write, and their size range
TRACKED = 4
TRACKED_NUMEL = (64, 1 << 18)
#: copy tensors whose version counters are read at a backward
READ_PER_BACKWARD = 32
#: share of the elements apart from the source that a write left where they were
STUCK_SHARE = 0.5


class AveragedCopies:
    """Deep copies of trained parameters, a few of their values at the latest judgement,
    and writes made between two backwards with no optimizer step in between."""

    def __init__(self, ownership: "ParameterOwnership") -> None:
        self._ownership = ownership
        self._held = ownership.held_by_optimizer
        #: parameters loaded from a state dict whose source (a parameter some optimizer holds
        #: with the same storage) is not known yet: looked for when optimizers' holdings change
        self._pending: WeakIdKeyDictionary[torch.Tensor, tuple[int, tuple[int, ...]]] = WeakIdKeyDictionary()
        self._resolved_at = -1
        self._sources: WeakIdKeyDictionary[torch.Tensor, weakref.ref[torch.Tensor]] = (
            WeakIdKeyDictionary())
        self._judged_version: WeakIdKeyDictionary[torch.Tensor, int] = WeakIdKeyDictionary()
        self._kept: WeakIdKeyDictionary[torch.Tensor, torch.Tensor] = WeakIdKeyDictionary()
        self._backward_version: WeakIdKeyDictionary[torch.Tensor, int] = WeakIdKeyDictionary()
        self._stepped_since_backward = True
        self._scaler_updates = 0
        self._averaged_between_backwards = False

    def install(self) -> list[PatchHandle]:
        def make(original: Callable[..., torch.nn.Parameter]) -> Callable[..., torch.nn.Parameter]:
            def deepcopy(source: torch.nn.Parameter, memo: dict[int, object]) -> torch.nn.Parameter:
                copied = original(source, memo)
                if copied is not source and isinstance(copied, torch.Tensor):
                    self._sources[copied] = weakref.ref(source)
                return copied
            return deepcopy
        return [patch_attribute(torch.nn.Parameter, "__deepcopy__", make)]

    def loaded_from(self, module: torch.nn.Module, state_dict: Any) -> None:
        """After ``module.load_state_dict(state_dict)``: its parameters given a live
        parameter's own storage (another model's ``state_dict()``) are copies of it.  The
        source is found once an optimizer holds it (a student is often loaded from before its
        optimizer is built)."""
        if not isinstance(state_dict, Mapping):
            return
        for name, param in module.named_parameters():
            value = state_dict.get(name)
            if isinstance(value, torch.Tensor) and value.data_ptr():
                self._pending[param] = (value.data_ptr(), tuple(value.shape))
        self._resolved_at = -1
        self._resolve()

    def _resolve(self) -> None:
        if not self._pending or self._ownership.holdings_changed == self._resolved_at:
            return
        self._resolved_at = self._ownership.holdings_changed
        live = {(param.data_ptr(), tuple(param.shape)): param for param in self._ownership.optimized_parameters()}
        for param, storage in list(self._pending.items()):
            source = live.get(storage)
            if source is not None:
                del self._pending[param]
                if source is not param:
                    self._sources[param] = weakref.ref(source)

    def is_average(self, param: torch.Tensor) -> bool:
        """A copy of parameters an optimizer trains that no optimizer holds: an EMA, a
        momentum teacher, a target network."""
        self._resolve()
        source_ref = self._sources.get(param)
        source = source_ref() if source_ref is not None else None
        return source is not None and self._held(source) and not self._held(param)

    def copied_from(self, copies: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> bool:
        """Whether some of ``copies`` are deep copies of some of ``sources``: an inner loop
        adapting a copy of meta-parameters (MAML, ProtoMAML, Reptile)."""
        wanted = {id(source) for source in sources}
        for copied in copies:
            source_ref = self._sources.get(copied)
            if source_ref is not None and id(source_ref()) in wanted:
                return True
        return False

    def _watched(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._resolve()
        for copied, source_ref in list(self._sources.items()):
            source = source_ref()
            if source is not None and self._held(source) and not self._held(copied):
                yield copied, source

    # -- a write between two backwards with no optimizer step ------------------------------
    def backward_ran(self, scaler_updates: int) -> None:
        """Before a backward outside an optimizer's update; ``scaler_updates``: how often loss
        scalers updated so far (an update since the previous backward attempted a step that
        the scaler may have skipped, and an average after it is not a second one)."""
        stepped = self._stepped_since_backward or scaler_updates != self._scaler_updates
        self._stepped_since_backward = False
        self._scaler_updates = scaler_updates
        for count, (copied, source) in enumerate(self._watched()):
            if count >= READ_PER_BACKWARD:
                break
            version = copied._version
            before = self._backward_version.get(copied)
            self._backward_version[copied] = version
            if not stepped and before is not None and version != before \
                    and _apart(copied, source) is not None:
                self._averaged_between_backwards = True

    def optimizer_stepped(self) -> None:
        self._stepped_since_backward = True

    # -- judged at an optimizer step --------------------------------------------------------
    def judge_step(self) -> tuple[bool | None, bool | None]:
        """``(updates_move_average, averages_once_per_step)`` for the copies written since
        the previous judgement (None: none written, or none judged)."""
        per_micro_batch, self._averaged_between_backwards = self._averaged_between_backwards, False
        moved = stuck = False
        written: set[int] = set()
        newly_written: list[torch.Tensor] = []
        for copied, source in self._watched():
            version = copied._version
            before = self._judged_version.get(copied)
            self._judged_version[copied] = version
            if before is None or version == before:
                continue
            written.add(id(copied))
            kept = self._kept.get(copied)
            if kept is None:
                newly_written.append(copied)
                continue
            if _stuck(copied, kept, source):
                stuck = True
            else:
                moved = True
            self._kept[copied] = copied.detach().clone()
        self._keep(newly_written, written)
        moves = False if stuck else (True if moved else None)
        once = False if per_micro_batch else (True if written else None)
        return moves, once

    def _keep(self, newly_written: list[torch.Tensor], written: set[int]) -> None:
        """Keep the values of a few copy tensors to judge their next write: those first seen,
        then, in place of ones never written since, those written without kept values."""
        if not self._kept:
            newly_written = [copied for copied, _ in self._watched()]
        candidates = [c for c in newly_written if _trackable(c)]
        if not candidates:
            return
        for copied in list(self._kept.keys()):
            if len(self._kept) + len(candidates) <= TRACKED:
                break
            if id(copied) not in written:
                del self._kept[copied]  # not written at this judgement
        for copied in candidates[: max(TRACKED - len(self._kept), 0)]:
            self._kept[copied] = copied.detach().clone()


def _trackable(copied: torch.Tensor) -> bool:
    low, high = TRACKED_NUMEL
    return copied.device.type == "cpu" and copied.is_floating_point() and low <= copied.numel() <= high


def _apart(copied: torch.Tensor, source: torch.Tensor) -> torch.Tensor | None:
    """Where the copy differs from its source (None: it does not; not an average)."""
    with torch.no_grad():
        if copied.shape != source.shape or copied.device != source.device:
            return None
        apart = copied != source.detach().to(copied.dtype)
        return apart if bool(apart.any()) else None


def _stuck(copied: torch.Tensor, kept: torch.Tensor, source: torch.Tensor) -> bool:
    """A write that left most elements of a half-precision copy, where it differs from its
    source, exactly where they were: the update rounded to nothing."""
    if copied.element_size() > 2 or kept.dtype != copied.dtype or kept.shape != copied.shape:
        return False
    apart = _apart(copied, source)
    if apart is None:
        return False
    with torch.no_grad():
        unchanged = (copied == kept) & apart
        return int(unchanged.sum()) > STUCK_SHARE * int(apart.sum())
