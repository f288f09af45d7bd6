"""What a DataLoader worker reports about its randomness.

"Every worker repeats the same augmentation" is a silent bug: training runs, the loss
looks fine, the data is less random than intended.  A worker therefore reports its
seeds once, as digests, so that checkers can ask whether they are distinct across
workers: torch's seed, numpy's and Python's global RNG states, and the RNG objects the
dataset owns (PyTorch reseeds the global ones per worker, but not a generator the
dataset created in ``__init__``; that copy arrives in every worker unchanged).
"""

from __future__ import annotations

import random
import sys
import itertools
from typing import TYPE_CHECKING, Any, Callable

import torch
import xxhash

from invariants.events import WORKER_INIT_API

from .replayed_rngs import fresh_dataset_rng

if TYPE_CHECKING:
    from .recorder import StepRecorder

#: How long a DataLoader worker waits, once at its start, for its seed report to be delivered.
WORKER_REPORT_DELIVERY_S = 2.0


def worker_seed_report(worker_id: int, num_workers: int) -> dict[str, Any]:
    """The ``args`` of the worker's one ``torch.utils.data.worker_init`` event."""
    numpy_digest = None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state = numpy.random.get_state()
        numpy_digest = xxhash.xxh3_64_hexdigest(state[1].tobytes() + str(state[2:]).encode())
    info = torch.utils.data.get_worker_info()
    return {
        "worker_id": worker_id,
        "num_workers": num_workers,
        "torch_seed": torch.initial_seed(),
        "numpy_state_digest": numpy_digest,
        "python_random_digest": xxhash.xxh3_64_hexdigest(repr(random.getstate()).encode()),
        "dataset_rng_digest": dataset_rng_digest(info.dataset) if info is not None else None,
    }


def dataset_rng_digest(dataset: Any) -> str | None:
    """Digest of the RNG objects a dataset owns (one attribute level), or None if none.

    PyTorch reseeds the global RNGs in every worker, so a dataset that keeps its own
    generator (``self.rng = np.random.default_rng(seed)``) is the form of "every worker
    repeats the same augmentation" that survives: its state arrives in every worker
    unchanged.  Equal digests across workers reveal it.
    """
    try:
        attributes = sorted(vars(dataset).items())
    except TypeError:
        return None
    numpy = sys.modules.get("numpy")
    hasher = xxhash.xxh3_64()
    found = False
    for name, value in attributes:
        state: Any = None
        if isinstance(value, random.Random):
            state = value.getstate()
        elif isinstance(value, torch.Generator):
            state = bytes(value.get_state().numpy())
        elif numpy is not None and isinstance(value, numpy.random.Generator):
            state = value.bit_generator.state
        elif numpy is not None and isinstance(value, numpy.random.RandomState):
            kind, keys, position, *rest = value.get_state()
            state = (kind, keys.tobytes(), position, rest)
        if state is not None:
            found = True
            hasher.update(name.encode() + b"=" + repr(state).encode())
    return hasher.hexdigest() if found else None


class WorkerReports:
    """A DataLoader worker's seed report, sent by a `Tracer` (a mixin) in the worker."""

    recorder: "StepRecorder"
    _cids: "itertools.count[int]"
    _event: Callable[..., dict[str, Any]]
    _ctx: Callable[[], dict[str, Any]]

    def worker_started(self, worker_id: int, num_workers: int, *, step: int | None = None,
                       training_pass: bool = False, replayed: str | None = None) -> None:
        """The one event a DataLoader worker sends: its seeds, then it stays quiet.

        ``step`` is the step that started the worker (see `WorkerStepTag`); a worker
        started by ``spawn`` would otherwise report step 0.  ``training_pass`` and
        ``replayed`` judge its contract `fresh_dataset_rng`.
        """
        if step is not None and step >= 0:
            self.recorder.step = step
        report = worker_seed_report(worker_id, num_workers)
        ctx = self._ctx()
        fresh = fresh_dataset_rng(report, training_pass, replayed)
        if fresh is not None:
            ctx["contract"] = {"fresh_dataset_rng": fresh}
        event = self._event(
            "call",
            name="torch.utils.data._utils.worker._worker_loop",
            api=WORKER_INIT_API,
            phase="post",
            cid=next(self._cids),
            parent=None,
            args=report,
            ret=None,
            ctx=ctx,
        )
        self.recorder.append(event)
        self.recorder.flush_partial()
        # A worker's only batch must not wait for the worker's exit: the workers still
        # running when training ends are terminated, not shut down, and a stream checker
        # holds the step open until every announced worker has reported.
        self.recorder.wait_delivered(WORKER_REPORT_DELIVERY_S)
