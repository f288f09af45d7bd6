"""Learning-rate schedules that start over when training resumes from a checkpoint.

A resumed job loads the model's and the optimizer's state, and must load its
schedulers' too (or build them with ``last_epoch`` at the resumed step).  A scheduler
left out of the checkpoint (accelerate saves only what went through ``prepare``, a
hand-written checkpoint that stores ``model`` and ``optimizer`` only: lightly-train#301,
accelerate#137, BasicSR#327) comes back at epoch 0: its first step sets the rate of the
schedule's beginning, so a warm-up replays and the decay is shifted by the resumed
steps, and nothing fails.

So each ``LRScheduler.step`` carries the contract ``resumes_schedule``: a scheduler
whose optimizer was resumed (``Optimizer.load_state_dict`` gave it per-parameter state,
which only steps create) does not take its first step after that resume from epoch 0,
unless it loaded a state dict of its own (a checkpoint saved before the scheduler's
first step).  Schedulers of optimizers that were not resumed hold it trivially; the
step that a scheduler's constructor takes is not judged.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

import torch
from torch.optim import lr_scheduler

from .patching import PatchHandle, patch_attribute


class ScheduleResumes:
    """Which optimizers were resumed, and which schedulers restored their own state."""

    def __init__(self) -> None:
        self._resumes = itertools.count(1)
        #: optimizer -> number of its latest resume
        self._resumed: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        #: scheduler -> the resume of its optimizer it was last judged or restored at
        self._settled: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._restored: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def optimizer_loaded(self, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            self._resumed[optimizer] = next(self._resumes)

    def scheduler_loaded(self, scheduler: Any) -> None:
        self._restored.add(scheduler)

    def resumes_schedule(self, scheduler: Any) -> bool | None:
        """Judged before ``scheduler.step()``."""
        epoch = getattr(scheduler, "last_epoch", None)
        optimizer = getattr(scheduler, "optimizer", None)
        if not isinstance(epoch, int) or epoch < 0 or not isinstance(optimizer, torch.optim.Optimizer):
            return None  # the constructor's own step
        resume = self._resumed.get(optimizer)
        if resume is None or self._settled.get(scheduler) == resume:
            return True
        self._settled[scheduler] = resume
        return epoch > 0 or scheduler in self._restored

    def install(self) -> list[PatchHandle]:
        """Note every scheduler that loads a state dict: torch's schedulers that define
        their own ``load_state_dict`` (``LambdaLR`` does, without calling the base's)
        are patched each."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def load_state_dict(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(scheduler, *args, **kwargs)
                self.scheduler_loaded(scheduler)
                return result

            return load_state_dict

        owners = [cls for cls in vars(lr_scheduler).values()
                  if isinstance(cls, type) and issubclass(cls, lr_scheduler.LRScheduler)
                  and "load_state_dict" in vars(cls)]
        return [patch_attribute(cls, "load_state_dict", make) for cls in owners]
