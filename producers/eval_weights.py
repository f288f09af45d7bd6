"""Training that resumes after an evaluation from weights the evaluation put there.

Evaluating with averaged weights means swapping them in and back out: diffusers'
``EMAModel.store()``/``copy_to()``/``restore()``, timm's and Lightning callbacks'
backup and restore.  When the restore is missing (diffusers issue 2321, Open-Sora-Plan
issue 186) the EMA weights stay in the model and the optimizer steps on from them,
its moments computed for other weights; the loss only looks smoother.  So at an
optimizer's first step after an evaluation (the stage switched to ``eval`` since its
previous step), the weights it holds must be those it left at that step — provided
they also were at its latest step without an evaluation in between: a loop that
changes weights between steps anyway (WGAN weight clipping, max-norm projection,
hand-written weight decay) shows it there, and is not judged; so does one that changes
them every few steps (a Lookahead wrapper writes its slow weights back every k steps,
and the evaluation may always follow such a step), seen in a spread sample of the
parameters compared in every interval without an evaluation.

The weights are compared by the data digests of the step snapshots: the post-step
snapshot of the previous step, against the pre-step snapshot of the next (between two
steps without an evaluation) or a digest taken before the first step after an
evaluation (one pass over the optimizer's parameters per evaluation).  Not judged:
steps whose neighbours were not snapshotted (sampling), digests not yet read back from
an accelerator, parameters several live optimizers hold, and an optimizer whose state
``Optimizer.load_state_dict`` restored since (a resume restores weights and moments
together), and an optimizer after whose previous step an optimizer over tensors no model
holds stepped: an outer optimizer over a copy of the weights that are then copied back
(DiLoCo's outer Nesterov step every few inner steps, with an evaluation after each sync)
writes weights it trained, not averaged ones.  Weights the optimizer itself left at its step before an earlier
evaluation are fine too: a "best" checkpoint taken after an evaluation and restored
after a worse one (newbob-style rollback, early stopping with patience) puts back
weights the optimizer trained, never averaged ones.  The contract is
``keeps_weights_after_eval`` on ``Optimizer.step``.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

Digests = dict[int, str]  # id(parameter) -> data digest
Snapshot = Sequence[tuple[Any, dict[str, Any]]]  # (entry, attrs) as a step snapshot took them


def _digests_of(taken: Snapshot) -> Digests:
    """The data digests a snapshot read; digests still on their way back from an
    accelerator are left out."""
    return {id(entry.param): attrs["data_digest"] for entry, attrs in taken
            if isinstance(attrs.get("data_digest"), str)}


def _unchanged(before: Digests, now: Digests) -> bool:
    return all(now[key] == digest for key, digest in before.items() if key in now)


#: parameters compared in every interval without an evaluation (evenly spread)
SAMPLED_PARAMETERS = 16
#: evaluations back to which a restored "best" checkpoint is recognised
REMEMBERED_EVALUATIONS = 32


def _sample_unchanged(before: Snapshot, now: Snapshot) -> bool:
    """Whether a spread sample of the parameters kept their data digests from one
    snapshot to the next (the same optimizer's, so listed in the same order)."""
    if len(before) != len(now):
        return _unchanged(_digests_of(before), _digests_of(now))
    for index in range(0, len(before), max(1, len(before) // SAMPLED_PARAMETERS)):
        (entry, attrs), (other, other_attrs) = before[index], now[index]
        if entry.param is not other.param:
            return _unchanged(_digests_of(before), _digests_of(now))
        digest, other_digest = attrs.get("data_digest"), other_attrs.get("data_digest")
        if isinstance(digest, str) and isinstance(other_digest, str) and digest != other_digest:
            return False
    return True


@dataclass
class _Steps:
    post: Snapshot | None = None  # after the latest step
    evaluations_at_post: int = 0
    outer_steps_at_post: int = 0
    #: the latest two neighbouring snapshots without an evaluation between them (the
    #: post-step one of a step, the pre-step one of the next): compared only when judging
    calm: tuple[Snapshot, Snapshot] | None = None
    #: some earlier interval without an evaluation changed a sample of the weights (a
    #: Lookahead's sync every k steps, a periodic projection): not judged from then on
    restless: bool = False
    #: the calm interval not sampled yet: compared at the next step or judgement, once
    #: digests computed on an accelerator have been read back
    unsampled: tuple[Snapshot, Snapshot] | None = None
    #: the weights it left before each of its latest evaluations (what a best checkpoint holds)
    before_evaluations: "deque[Digests]" = field(default_factory=lambda: deque(maxlen=REMEMBERED_EVALUATIONS))


class EvalWeights:
    """Per optimizer: the snapshot it left at its latest step, and the latest interval
    between two of its steps in which nothing evaluated.  Snapshots are kept as taken;
    digests are only compared at the first step after an evaluation."""

    def __init__(self) -> None:
        self.evaluations = 0
        #: steps of optimizers over tensors no model holds (outer optimizers over weight copies)
        self.outer_steps = 0
        self._steps: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _Steps]" = weakref.WeakKeyDictionary()

    def evaluated(self) -> None:
        self.evaluations += 1

    def forget_steps(self) -> None:
        """Every optimizer's weights changed in ways no step saw (a rank shadowing ``Join``)."""
        self._steps.clear()

    def state_loaded(self, optimizer: torch.optim.Optimizer) -> None:
        steps = self._steps.get(optimizer)
        if steps is not None:
            steps.post = steps.calm = None

    def keeps_weights_after_eval(self, optimizer: torch.optim.Optimizer,
                                 digest_now: Callable[[], Digests], outside_models: bool) -> bool | None:
        """Judged before a step's ``pre`` event; ``digest_now`` digests the parameters
        the optimizer alone holds (called only at its first step after an evaluation);
        ``outside_models``: the optimizer holds tensors no model holds (counted after
        its own judgement, so that an optimizer over raw tensors is still judged)."""
        verdict = self._judge(optimizer, digest_now)
        if outside_models:
            self.outer_steps += 1
        return verdict

    def _judge(self, optimizer: torch.optim.Optimizer, digest_now: Callable[[], Digests]) -> bool | None:
        steps = self._steps.get(optimizer)
        if steps is not None:
            self._sample(steps)
        if steps is None or steps.post is None or steps.evaluations_at_post == self.evaluations or steps.restless:
            return None
        if steps.outer_steps_at_post != self.outer_steps:
            return None  # an outer optimizer stepped over a copy of the weights since
        if steps.calm is None or not _unchanged(_digests_of(steps.calm[0]), _digests_of(steps.calm[1])):
            return None  # weights change between steps anyway, or no calm interval was seen
        left, now = _digests_of(steps.post), digest_now()
        kept = _unchanged(left, now) or any(
            _unchanged(earlier, now) and not earlier.keys().isdisjoint(now) for earlier in steps.before_evaluations)
        steps.before_evaluations.append(left)
        return kept

    def stepped(self, optimizer: torch.optim.Optimizer, pre: Snapshot | None, post: Snapshot | None) -> None:
        """After a step, with its pre- and post-step snapshots (None: not taken)."""
        steps = self._steps.setdefault(optimizer, _Steps())
        if steps.post is not None and pre is not None and steps.evaluations_at_post == self.evaluations:
            steps.calm = (steps.post, pre)
            self._sample(steps)
            steps.unsampled = steps.calm
        steps.post, steps.evaluations_at_post, steps.outer_steps_at_post = post, self.evaluations, self.outer_steps

    @staticmethod
    def _sample(steps: _Steps) -> None:
        if steps.unsampled is not None and not steps.restless:
            steps.restless = not _sample_unchanged(*steps.unsampled)
        steps.unsampled = None
