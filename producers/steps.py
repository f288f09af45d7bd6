"""When does a training step end?  Learning the optimizer cycle of an iteration.

A step ends after the optimizer step hook fires — but with several optimizers per
iteration (a GAN's discriminator and generator) it must end after the *last* one.
The cycle is learnt during the first iteration: the distinct optimizers that step
before one of them steps again, in order.  Until then the step end is only known in
hindsight, so the tracker tells the session where to cut retroactively.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CycleDecision:
    """What the session should do at an optimizer hook."""

    end_step: bool = False
    #: end the open step retroactively at the buffer position recorded after the last
    #: optimizer of the (just learnt) cycle stepped
    cut_at: int | None = None


@dataclass
class OptimizerCycle:
    """Pure state machine over optimizer ids; no torch, so it is trivially testable."""

    order: list[int] = field(default_factory=list)
    learnt: bool = False
    _last_post_position: int | None = None

    def before_step(self, optimizer_id: int) -> CycleDecision:
        if self.learnt or optimizer_id not in self.order:
            if not self.learnt:
                self.order.append(optimizer_id)
            return CycleDecision()
        # An optimizer steps a second time: the cycle is everything seen so far, and the
        # previous step ended right after the last optimizer of the cycle stepped.
        self.learnt = True
        return CycleDecision(end_step=True, cut_at=self._last_post_position)

    def after_step(self, optimizer_id: int, buffer_position: int) -> CycleDecision:
        if not self.learnt:
            self._last_post_position = buffer_position
            return CycleDecision()
        if self.order and optimizer_id == self.order[-1]:
            return CycleDecision(end_step=True)
        return CycleDecision()

    @property
    def pending_cut(self) -> int | None:
        """Where the open step would end if the run stopped during the first iteration."""
        return None if self.learnt else self._last_post_position
