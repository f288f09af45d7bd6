"""Instrumentation of unmodified PyTorch training, and the sinks that ship its events.

Two ways in, one machinery:

* ``trainwatch collect -- CMD...`` puts `producers/bootstrap` on ``PYTHONPATH``; every
  Python process of CMD installs the instrumentation as soon as it imports torch.
* In code::

      import producers
      with producers.instrument(trace_dir="traces/run1") as session:
          train()                       # unmodified
          with session.stage("eval"):   # optional explicit stage annotation
              validate()

Torch is imported lazily so that ``import producers`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["instrument", "Session"]


def instrument(*args: Any, **kwargs: Any) -> Any:
    """Context manager: instrument the block and yield its `Session`.

    ``instrument(run_id=None, trace_dir=None, bootstrap=None, selection=None,
    sample_every=1, quiet=False, overhead_budget=None)``: with neither ``trace_dir`` nor
    ``bootstrap`` the trace goes to ``./traces/<run_id>``.  ``selection`` is None (curated
    default), a path (``-i`` file) or an iterable of API names.  ``overhead_budget=0.05``
    thins parameter snapshots to keep the producer within 5 % of each step
    (`producers.sampling`).
    """
    from .session import instrument as _instrument

    return _instrument(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "Session":
        from .session import Session

        return Session
    raise AttributeError(name)
