"""When does a training step end?  Learning the optimizer cycle of an iteration.

A step ends after the optimizer step hook fires — but with several optimizers per
iteration (a GAN's discriminator and generator) it must end after the *last* one.
The cycle is learnt during the first iteration: the distinct optimizers that step
before one of them steps again, in order.  Until then the step end is only known in
hindsight, so the tracker tells the session where to cut retroactively.

Training may switch optimizers (Adam, then LBFGS fine-tuning).  An optimizer outside
the cycle that steps twice while no cycle optimizer stepped in between replaces the
cycle, cut the same retroactive way; one that steps now and then next to the cycle
(an auxiliary head) does not.  A cycle whose *last* optimizer stopped stepping (a GAN
whose generator and its optimizer were built again) would never end a step: when the
cycle's first optimizer steps again with no step ended since its previous step, the
optimizers that stepped in between become the cycle, cut after the last of them.
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
    #: optimizers outside the learnt cycle that stepped in the open step -> post position
    _foreign_posts: dict[int, int] = field(default_factory=dict)
    #: (optimizer, post position) of every step since the cycle's first optimizer last
    #: stepped in the open step (None: it has not)
    _since_first: list[tuple[int, int]] | None = None

    def before_step(self, optimizer_id: int) -> CycleDecision:
        if self.learnt:
            if optimizer_id == self.order[0] and len(self.order) > 1:
                stale = self._since_first
                self._since_first = []
                if stale:  # a whole cycle went by and no step ended: its last optimizer left
                    self.order = list(dict.fromkeys(opt for opt, _ in stale))
                    self._foreign_posts.clear()
                    return CycleDecision(end_step=True, cut_at=stale[-1][1])
            if optimizer_id in self.order:
                self._foreign_posts.clear()
                return CycleDecision()
            cut = self._foreign_posts.get(optimizer_id)
            if cut is None:
                return CycleDecision()
            # The cycle went stale: this optimizer alone drives the steps now.
            self.order = [optimizer_id]
            self._foreign_posts.clear()
            return CycleDecision(end_step=True, cut_at=cut)
        if optimizer_id not in self.order:
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
        if self._since_first is not None:
            self._since_first.append((optimizer_id, buffer_position))
        if self.order and optimizer_id == self.order[-1]:
            return CycleDecision(end_step=True)
        if optimizer_id not in self.order:
            self._foreign_posts[optimizer_id] = buffer_position
        return CycleDecision()

    def step_ended(self) -> None:
        """Positions are per open step: forget those of the step that just ended."""
        self._foreign_posts.clear()
        self._since_first = None

    @property
    def pending_cut(self) -> int | None:
        """Where the open step would end if the run stopped during the first iteration."""
        return None if self.learnt else self._last_post_position
