"""Gradients that pile up over the evaluations of one optimizer step's closure.

``LBFGS`` (and any optimizer that searches along a direction) calls the closure it is
given several times per step, and reads the gradients each call leaves: the closure
must clear them before its backward, as the PyTorch docs' closure example does.  A loop
that clears once per step, outside the closure (the natural place for every other
optimizer), hands the line search gradients summed over all evaluations so far
(Lightning issue 4083, fixed by PR 6147): the step count, the loss and the curves look
normal while the search follows a gradient several times too large and stale.

So a backward inside the second or later evaluation of a step's closure carries the
contract ``clears_between_evaluations``: that optimizer's gradients were cleared since
the evaluation began.  The first evaluation is not judged (clearing before ``step`` is
fine there), and nor are closures that set gradients without a backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Evaluation:
    optimizer_name: str
    index: int
    cleared: bool = False


@dataclass
class ClosureClears:
    """The closures under way (innermost last) and each stepping optimizer's evaluations."""

    _running: list[_Evaluation] = field(default_factory=list)
    #: evaluations so far of the step under way, by ``id`` of its optimizer
    _counts: dict[int, int] = field(default_factory=dict)

    def evaluation_begins(self, optimizer_key: int, optimizer_name: str) -> None:
        index = self._counts.get(optimizer_key, 0) + 1
        self._counts[optimizer_key] = index
        self._running.append(_Evaluation(optimizer_name, index))

    def evaluation_ended(self) -> None:
        if self._running:
            self._running.pop()

    def step_ended(self, optimizer_key: int) -> None:
        if self._counts:
            self._counts.pop(optimizer_key, None)

    def cleared(self, optimizer_names: list[str]) -> None:
        for evaluation in self._running:
            if evaluation.optimizer_name in optimizer_names:
                evaluation.cleared = True

    def clears_between_evaluations(self) -> bool | None:
        """At a backward: None outside closures and in a step's first evaluation."""
        if not self._running or self._running[-1].index < 2:
            return None
        return self._running[-1].cleared
