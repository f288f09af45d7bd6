"""DataLoader workers: where their one event comes from and which step it belongs to.

A worker is a separate process (forked or spawned) that only loads data.  It reports
its seeds once, after torch and the user's ``worker_init_fn`` seeded it, and stays
quiet; the rank that started it announces how many to wait for.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch

from invariants.events import DATALOADER_WORKERS_META

from .patching import PatchHandle, patch_attribute
from .workers import dataset_rng_digest

if TYPE_CHECKING:
    from .tracer import Tracer


class WorkerStepTag:
    """A DataLoader's ``worker_init_fn``, tagged with the step that starts the workers,
    whether a training pass starts them, and the dataset RNG state they would replay
    (`producers.replayed_rngs`).

    Pickled into every worker with the init function itself, so a worker knows its
    step whatever the start method: a forked worker inherits the counter, but one
    started by ``spawn`` or ``forkserver`` begins a fresh process at step 0.  Calling
    it calls the user's function (if any), so an uninstrumented worker sees no change.
    """

    def __init__(self, inner: Callable[[int], Any] | None, step: int, training_pass: bool = False,
                 replayed: str | None = None) -> None:
        self.inner = inner
        self.step = step
        self.training_pass = training_pass
        self.replayed = replayed

    def __call__(self, worker_id: int) -> Any:
        return None if self.inner is None else self.inner(worker_id)


def patch_worker_start(tracer: "Tracer") -> PatchHandle:
    """Announce DataLoader workers in the step that starts them, and tell them that step.

    Each worker sends its seeds in a batch of its own, over its own connection, so it
    reaches a stream checker after the rank's step end.  The announcement tells the
    checker how many such batches to wait for before it judges the step (rules about
    distinct worker seeds need them all).
    """
    from torch.utils.data import dataloader as dataloader_module

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def start_workers(self: Any, loader: Any, *args: Any, **kwargs: Any) -> Any:
            tagged = False
            try:
                workers = int(getattr(loader, "num_workers", 0) or 0)
                if workers > 0 and tracer.enabled:
                    step = tracer.recorder.step
                    user_init = loader.worker_init_fn
                    training = torch.is_grad_enabled() and not tracer.root_in_eval_mode()
                    replayed = (tracer.contracts.replayed_rngs.training_pass(loader.dataset, dataset_rng_digest(loader.dataset))
                                if training else None)
                    loader.worker_init_fn = WorkerStepTag(user_init, step, training, replayed)
                    tagged = True
                    tracer.record_meta(DATALOADER_WORKERS_META, workers=workers)
                    tracer.active = True  # its windows hold the workers' reports: they must close
            except Exception as exc:
                tracer.internal_error("DataLoader worker announcement", exc)
            try:
                return original(self, loader, *args, **kwargs)
            finally:
                if tagged:
                    loader.worker_init_fn = user_init

        return start_workers

    return patch_attribute(dataloader_module._MultiProcessingDataLoaderIter, "__init__", make)


def patch_worker_loop(tracer: "Tracer") -> PatchHandle:
    """DataLoader workers: report seeds once (after torch seeded them), then stay quiet."""
    import torch.utils.data._utils.worker as worker_module

    from .runtime import close_worker_session

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def worker_loop(*args: Any, **kwargs: Any) -> Any:
            tracer.enabled = False  # a worker only loads data; nothing else to record
            try:
                bound = signature.bind(*args, **kwargs)
                user_init = bound.arguments.get("init_fn")
                tag = user_init if isinstance(user_init, WorkerStepTag) else WorkerStepTag(user_init, -1)
                user_init = tag.inner
                num_workers = int(bound.arguments.get("num_workers", 0))

                def init_fn(worker_id: int) -> None:
                    # After the user's init: its reseeding is part of what is reported.
                    if user_init is not None:
                        user_init(worker_id)
                    try:
                        tracer.worker_started(worker_id, num_workers, step=tag.step, training_pass=tag.training_pass,
                                              replayed=tag.replayed)
                    except Exception as exc:
                        tracer.internal_error("DataLoader worker start", exc)

                bound.arguments["init_fn"] = init_fn
                args, kwargs = bound.args, bound.kwargs
            except Exception as exc:
                tracer.internal_error("DataLoader worker wrapper", exc)
            try:
                return original(*args, **kwargs)
            finally:
                close_worker_session()

        return worker_loop

    return patch_attribute(worker_module, "_worker_loop", make)
