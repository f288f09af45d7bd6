"""Where a process's setup ends and where its training iterations end without an optimizer.

The optimizer step is the strongest iteration boundary (see `producers.steps`), but
real training code does not always have one: hand-written ``p.data.add_(-lr * p.grad)``
loops, optimizers outside ``torch.optim``, a step that is skipped (a loss scaler that
found an overflow) or never reached (a forgotten ``optimizer.step()``).  This tracker
recognises the iteration from what every training loop does instead: a backward pass,
then a new root forward in training mode (or, in a loop with no optimizer at all, a new
``zero_grad``).  It is a pure state machine over those signals, so it is trivially
testable; the tracer feeds it and applies its decisions.

Setup (model construction, initialisation, seeding, DataLoader start-up) is what comes
before the first iteration.  Where the first iteration *begins* is only known in
hindsight, when it first does something only training does (a backward, an optimizer
step): it began at its first loop-start signal (a ``zero_grad`` or a root forward in
training mode), so the setup window is cut there, retroactively.  A process that never
trains (an evaluation job, a DataLoader-only program) is all setup.

Gradient accumulation runs several backward passes per optimizer step, so a new
forward after a backward ends an iteration only in a loop without an optimizer.  Until
the first optimizer step of a run it is unknown whether one will come: a run with a
known optimizer waits ``ACCUMULATION_PATIENCE`` micro-batches for it before it treats
each micro-batch as an iteration of its own.  Clearing gradients after a backward with
no step in between ends an iteration in every loop: nothing accumulates across a clear,
so the step was skipped (a loss scaler that found an overflow) or never called.
"""

from __future__ import annotations

from dataclasses import dataclass

#: micro-batches a run with a known optimizer may accumulate before its first step
ACCUMULATION_PATIENCE = 64


@dataclass(frozen=True)
class Boundary:
    """What the tracer must do before it records the signal's own event.

    The tracker has already moved on when it returns one: the window it ends is
    counted, and the signal belongs to the window that follows.
    """

    #: end the setup window at this buffer position of the open (setup) step
    end_setup_at: int | None = None
    #: end the open window here, before the signal's event (boundary "loop"); it held
    #: a training iteration
    end_iteration: bool = False


NO_BOUNDARY = Boundary()


@dataclass
class IterationTracker:
    """Pure state over loop signals; positions are buffer positions of the open step."""

    in_setup: bool = True
    optimizer_steps: int = 0
    iterations: int = 0
    _setup_candidate: int | None = None
    _backward_since_reset: bool = False
    _micro_batches: int = 0
    _loop_mode: bool = False
    _window_backward: bool = False
    _window_stepped: bool = False

    # -- signals --------------------------------------------------------------------
    def loop_start(self, position: int, *, zero_grad: bool, optimizer_known: bool) -> Boundary:
        """A root forward in training mode, or a ``zero_grad``, outside an optimizer step."""
        if self.in_setup:
            if self._setup_candidate is None:
                self._setup_candidate = position
            return NO_BOUNDARY
        if not self._backward_since_reset:
            return NO_BOUNDARY  # the first forward (or clear) of an iteration
        if not zero_grad:
            if self.optimizer_steps:
                return NO_BOUNDARY  # a micro-batch: the optimizer step ends the iteration
            self._backward_since_reset = False
            self._micro_batches += 1
            if optimizer_known and not self._loop_mode and self._micro_batches <= ACCUMULATION_PATIENCE:
                return NO_BOUNDARY
            self._loop_mode = True
        self.window_ended()
        return Boundary(end_iteration=True)

    def setup_activity(self) -> None:
        """An initialisation after a loop-start signal: setup is still going on."""
        if self.in_setup:
            self._setup_candidate = None

    def backward(self, position: int) -> Boundary:
        decision = self._leave_setup(position)
        self._backward_since_reset = True
        self._window_backward = True
        return decision

    def optimizer_step_begins(self, position: int) -> Boundary:
        return self._leave_setup(position)

    def optimizer_step_ended(self) -> None:
        self.optimizer_steps += 1
        self._window_stepped = True
        self._micro_batches = 0
        self._backward_since_reset = False

    def window_ended(self) -> bool:
        """The open window closed; returns whether it held a training iteration."""
        trained = not self.in_setup and (self._window_backward or self._window_stepped)
        if trained:
            self.iterations += 1
        self._micro_batches = 0
        self._backward_since_reset = False
        self._window_backward = False
        self._window_stepped = False
        return trained

    def _leave_setup(self, position: int) -> Boundary:
        if not self.in_setup:
            return NO_BOUNDARY
        cut = self._setup_candidate if self._setup_candidate is not None else position
        self.window_ended()  # the setup window: never an iteration
        self.in_setup = False
        self._setup_candidate = None
        return Boundary(end_setup_at=cut)
