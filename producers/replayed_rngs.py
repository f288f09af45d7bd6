"""DataLoader workers that replay an earlier epoch's random stream.

A dataset that owns its RNG (MONAI's ``Randomizable`` transforms keep ``self.R``, patch
samplers keep a ``RandomState``) draws from it only in the workers, each of which works
on its own copy.  The parent's copy never advances, so workers that are started again
each epoch (``persistent_workers=False``, the default) start from the very state the
previous epoch's workers started from: every epoch replays the same crops, flips and
noise (MONAI issue 1068), and the model re-fits one epoch's worth of samples.  PyTorch
reseeds the global RNGs in every worker, not a generator the dataset holds; a
``worker_init_fn`` that reseeds it from the worker's seed is the fix.

So when a training pass (gradients enabled, the model not in evaluation mode) starts
workers, the parent notes its dataset's RNG digest; if an earlier training pass
started workers from the same digest, each worker reports, after the user's
``worker_init_fn`` ran, whether its dataset's RNG is still at that state: the contract
``fresh_dataset_rng`` of its seed report.  Datasets without an RNG of their own,
passes without gradients or in evaluation mode (a validation set with fixed
augmentation on purpose), and workers started once are not judged.
"""

from __future__ import annotations

import weakref
from typing import Any


class ReplayedRngs:
    """Per dataset: the RNG digest its workers of the latest training pass started from."""

    def __init__(self) -> None:
        self._started: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()

    def training_pass(self, dataset: Any, digest: str | None) -> str | None:
        """At a training pass's worker start, given the dataset's RNG digest
        (`producers.workers.dataset_rng_digest`): that digest when an earlier training
        pass started its workers from that very state, else None."""
        try:
            previous = self._started.get(dataset)
            if digest is None:
                self._started.pop(dataset, None)
            else:
                self._started[dataset] = digest
        except TypeError:  # a dataset that cannot be weakly referenced
            return None
        return digest if digest is not None and previous == digest else None


def fresh_dataset_rng(report: dict[str, Any], training_pass: bool, replayed: str | None) -> bool | None:
    """The contract of a worker's seed report (None: not judged)."""
    digest = report.get("dataset_rng_digest")
    if not training_pass or digest is None:
        return None
    return digest != replayed
