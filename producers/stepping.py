"""The windows of one process: its setup, its training iterations, its tail.

A window is what a checker judges at once.  Step 0 is the setup window (everything
before the first training iteration; a process that never trains is all setup), steps
1..N are training iterations, and the last window (``final``) holds what follows the
last iteration.  Two state machines decide the boundaries: `OptimizerCycle` (the
optimizer step, the strongest boundary, with several optimizers per iteration) and
`IterationTracker` (setup, and iterations of loops whose optimizer step is missing,
skipped or not a ``torch.optim`` one).  This mixin of `Tracer` feeds them and applies
what they decide: cuts, snapshots at boundaries, the ``step``/``end`` flags.

Closures passed to ``Optimizer.step(closure)`` (LBFGS, Lightning) run the iteration's
``zero_grad``/forward/backward inside the step.  The step's ``pre`` event and its
pre-step snapshot wait until the closure first returns, so a window reads in the order
the work had effect: gradients produced, then the update.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from invariants.events import (BACKWARD_APIS, GRAD_CLEAR_API, MODULE_ZERO_GRAD, OPTIMIZER_STEP, OPTIMIZER_ZERO_GRAD,
                               PARAM_OVERWRITE, PRODUCER_STATS_META, RUN_END_META, optimizer_id)

from .functional_grads import PendingGradients
from .iterations import Boundary, IterationTracker
from .call_state import CallToken, InnerSteps, closure_of
from .grad_clears import HandClears, cleared_inside_optimizer_update
from .learning_rates import all_rates_zero
from .sampler_epochs import record_trained_passes
from .trainer_passes import LeftOutCalls
from .selection import INIT_FUNCTIONS
from .steps import OptimizerCycle

ZERO_GRAD_APIS = frozenset({OPTIMIZER_ZERO_GRAD, MODULE_ZERO_GRAD})
SETUP_APIS = frozenset({*INIT_FUNCTIONS, PARAM_OVERWRITE})
REFRESH_EVERY_STEPS = 16


class StepBoundaries:
    """Window boundaries of a `Tracer` (a mixin: it uses the tracer's recorder and snapshots)."""

    def _init_boundaries(self) -> None:
        self.cycle = OptimizerCycle()
        self.loop = IterationTracker()
        self._stepping: set[int] = set()  # optimizers inside their step (a closure may run there)
        self._inner_steps = InnerSteps()
        self._deferred_steps: set[int] = set()  # steps whose pre event waits for their closure
        self._open_steps: dict[int, CallToken] = {}
        self.left_out = LeftOutCalls()  # calls a trainer makes without a backward
        self._pending_end_states: list[dict[str, Any]] = []
        self.hand_clears = HandClears()
        #: optimizers (``opt<i>``) whose gradients were cleared since their last step
        self._cleared_since_step: set[str] = set()
        self._backward_ran = False  # any backward pass in this process so far
        self._backward_since_step = False  # a backward ran since the last optimizer step
        self._skip_signalled = False  # a hand clear already ended this iteration (a skipped step)
        self.backward_keeps_graph = False  # the latest backward retained its graph
        self.functional_gradients = PendingGradients()  # `producers.functional_grads`
        #: buffer position where the open window's non-training tail began (None once the
        #: window trains): what a later switch to ``eval`` relabels
        self._tail_start: int | None = None

    @property
    def in_optimizer_step(self) -> bool:
        return bool(self._stepping)

    @property
    def backward_pending(self) -> bool:
        """A backward ran since the last optimizer step (its gradients are not used yet)."""
        return self._backward_since_step

    # -- loop signals -------------------------------------------------------------------
    def loop_signal(self, api: str) -> None:
        """Before a wrapped call's ``pre`` event: it may end setup or an iteration."""
        if api in BACKWARD_APIS or api == OPTIMIZER_STEP:
            self._record_hand_clears()
            if api in BACKWARD_APIS:
                if not self._stepping:
                    self.contracts.backward_ran(self.backward_keeps_graph)
                self._backward_ran = self._backward_since_step = True
                self._skip_signalled = False
                self.hand_clears.backward_ran()
            else:
                self._backward_since_step = False
        if self._stepping:
            return
        position = self.recorder.position
        if api in ZERO_GRAD_APIS:
            if cleared_inside_optimizer_update() or self.contracts.wasted_grads.weights_moved():
                return  # SAM's ascent clears between its two backward passes: not the loop's clear
            if self._backward_since_step and self.backward_keeps_graph:
                return  # one objective's gradients copied before the next (`producers.retained_graphs`)
            decision = self.loop.loop_start(position, zero_grad=True, optimizer_known=self.ownership.optimizer_known)
        elif api in BACKWARD_APIS:
            decision = self.loop.backward(position)
        elif api in SETUP_APIS:
            self.loop.setup_activity()
            return
        else:
            return
        self._tail_start = None
        self._apply(decision)

    def _functional_backward(self) -> None:
        """At a training forward or the session's end: torch.func gradients computed since
        are the iteration's backward where no optimizer's steps end the iterations."""
        if self.functional_gradients.take() and not self.ownership.optimizer_known:
            self._apply(self.loop.backward(self.recorder.position))

    def grad_cleared_by_hand(self, param: torch.Tensor) -> None:
        """``param.grad = None`` or ``param.grad.zero_()`` written by user code: the
        first such clear since the last backward is a loop signal, like ``zero_grad`` —
        between a backward and its optimizer step, only once an optimizer's gradients
        are all cleared (a skipped step; clearing a few freezes them for the step)."""
        first = self.hand_clears.note(param)
        if self._stepping:
            return
        if self._backward_since_step and self.ownership.optimizer_known:
            if self._skip_signalled or not self.hand_clears.empties_an_optimizer(param, self.ownership.live_optimizers):
                return
            self._skip_signalled = True
        elif not first:
            return
        self._tail_start = None
        self._apply(self.loop.loop_start(
            self.recorder.position, zero_grad=True, optimizer_known=self.ownership.optimizer_known))

    def note_clears(self, api: str, extra: dict[str, Any]) -> None:
        """Remember which optimizers a recorded call cleared (their next step says so)."""
        if api == OPTIMIZER_ZERO_GRAD and isinstance(extra.get("obj"), str):
            cleared = [extra["obj"]]
        elif api in (MODULE_ZERO_GRAD, GRAD_CLEAR_API):
            cleared = [name for name in extra.get("clears") or () if isinstance(name, str)]
        else:
            return
        self._cleared_since_step.update(cleared)
        self.contracts.cycles_cleared(cleared)

    def _record_hand_clears(self) -> None:
        """One ``grad_clear`` call for the hand clears since the last backward or step."""
        clears = self.hand_clears.take(self.ownership.live_optimizers())
        if clears is not None and self.selection.wants(GRAD_CLEAR_API):
            self.end_call(self.begin_call(GRAD_CLEAR_API, "torch.Tensor.grad (cleared by hand)", {},
                                          extra={"clears": clears}))

    def root_forward_signal(self) -> None:
        """A model root runs forward in training mode with gradients on."""
        if self._stepping:
            return
        self._tail_start = None
        self._functional_backward()
        decision = self.loop.loop_start(
            self.recorder.position, zero_grad=False, optimizer_known=self.ownership.optimizer_known
        )
        self._apply(decision)

    def _apply(self, decision: Boundary) -> None:
        if decision.end_setup_at is not None:
            if self.registry.stale:  # name what setup built by its model, not opt<i>.g<j>.p<k>
                self._refresh_names()
            self._end_step(cut_at=decision.end_setup_at, states=self._end_states(), setup=True)
        elif decision.end_iteration:
            if not self.ownership.stepped:
                self.ownership.loop_trained(entry.param for entry in self.registry.all_entries())
            self._end_step(states=self._end_states(), trained=True, boundary="loop")

    # -- optimizer steps (global hooks) -------------------------------------------------
    def optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if not self.enabled or self._tls.busy or self.skip_compiled():
            return None
        try:
            if self._inner_steps.begins(optimizer, self._stepping):
                return None
            if self.left_out.step_begins(optimizer):
                return None
            index = self.registry.add_optimizer(optimizer)
            self.ownership.optimizer_seen(optimizer, index)
            self.contracts.wasted_grads.optimizer_stepped()
            self._tail_start = None
            self._apply(self.loop.optimizer_step_begins(self.recorder.position))
            self._stepping.add(id(optimizer))
            decision = self.cycle.before_step(id(optimizer))
            if decision.end_step:
                self._end_step(
                    cut_at=decision.cut_at, states=self._pending_end_states,
                    trained=self.loop.window_ended(), boundary="optimizer",
                )
            closure, by_keyword = closure_of(args, kwargs)
            if closure is None:
                self._begin_step_call(optimizer)
                return None
            self._deferred_steps.add(id(optimizer))
            wrapped = self._closure_then_step(closure, optimizer)
            if by_keyword:
                return args, {**kwargs, "closure": wrapped}
            return (args[0], wrapped, *args[2:]), kwargs
        except Exception as exc:
            self.internal_error("optimizer step pre-hook", exc)
            return None

    def _closure_then_step(self, closure: Callable[..., Any], optimizer: torch.optim.Optimizer) -> Callable[..., Any]:
        name = optimizer_id(self.registry.add_optimizer(optimizer))

        def closure_then_step(*args: Any, **kwargs: Any) -> Any:
            self._inner_steps.in_closures += 1
            self.contracts.closure_clears.evaluation_begins(id(optimizer), name)
            try:
                return closure(*args, **kwargs)
            finally:
                self._inner_steps.in_closures -= 1
                self.contracts.closure_clears.evaluation_ended()
                if id(optimizer) in self._deferred_steps:
                    self._deferred_steps.discard(id(optimizer))
                    try:
                        self._begin_step_call(optimizer)
                    except Exception as exc:
                        self.internal_error("optimizer step after its closure", exc)

        return closure_then_step

    def _begin_step_call(self, optimizer: torch.optim.Optimizer) -> None:
        record_trained_passes(self)
        if not self.selection.wants(OPTIMIZER_STEP):
            return
        cls = type(optimizer)
        # A step at learning rate 0 (the first step of a warm-up from 0) updates nothing
        # by design: it is recorded, but not bracketed by snapshots that rules about
        # updates would judge.  ``trained`` is false at an optimizer's first step.
        index = self.registry.add_optimizer(optimizer)
        trained = index in self.ownership.stepped
        if not trained:
            self.contracts.rewinds.first_step(optimizer)
        name = optimizer_id(index)
        cleared = name in self._cleared_since_step
        self._cleared_since_step.discard(name)
        with self._tls.own_work():  # the contracts' tensor reads are not the user's calls
            contract = self.contracts.at_step(optimizer, name, self.registry.roots, self.ownership,
                                              self.registry.names_in_model)
        drawn = self.contracts.replica_batches.take()
        args: dict[str, Any] = {"self": optimizer}
        if drawn is not None and self.replicas.is_replica(self.registry.roots()):
            args["batch_digest"] = drawn
        token = self.begin_call(
            OPTIMIZER_STEP, f"{cls.__module__}.{cls.__qualname__}.step", args,
            extra={"obj": name, "trained": trained, "cleared": cleared,
                   "backprop": self._backward_ran,
                   "fed": self.contracts.fed_steps.fed(optimizer)},
            optimizer=None if all_rates_zero(optimizer) else optimizer,
            contract=contract,
        )
        if token is not None:
            self._open_steps[id(optimizer)] = token

    def optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.enabled or self._tls.busy or torch.compiler.is_compiling():
            return
        try:
            if self._inner_steps.ends(optimizer):
                return
            if self.left_out.step_ended(optimizer):
                return
            self._stepping.discard(id(optimizer))
            if not self._stepping:
                self._inner_steps.outer_ended()
            if id(optimizer) in self._deferred_steps:  # the step never called its closure
                self._deferred_steps.discard(id(optimizer))
                self._begin_step_call(optimizer)
            token = self._open_steps.pop(id(optimizer), None)
            self.end_call(token)
            just_taken = token.post_attrs if token is not None else None
            self.contracts.eval_weights.stepped(optimizer, token.pre_attrs if token else None, just_taken)
            self.loop.optimizer_step_ended()
            self.ownership.optimizer_stepped(optimizer, self.registry.add_optimizer(optimizer))
            self.contracts.optimizer_step_ended(optimizer)
            self.contracts.closure_clears.step_ended(id(optimizer))
            decision = self.cycle.after_step(id(optimizer), self.recorder.position)
            if not self.cycle.learnt:
                # The step may have ended here; keep what its end snapshot would be.
                self._pending_end_states = self._end_states(just_taken)
            if decision.end_step:
                self._end_step(
                    states=self._end_states(just_taken), trained=self.loop.window_ended(), boundary="optimizer"
                )
            self._tail_start = self.recorder.position
        except Exception as exc:
            self.internal_error("optimizer step hook", exc)

    # -- ending windows -----------------------------------------------------------------
    def _end_states(self, just_taken: list[tuple[Any, dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
        """Step-end snapshot of every parameter; reuses the post-step one taken this instant."""
        if not (self._snapshots and self.sampled and self.selection.wants_point("step_end")):
            return []
        entries = self.registry.all_entries()
        if just_taken is not None and len(just_taken) == len(entries):
            if {id(e.param) for e, _ in just_taken} == {id(e.param) for e in entries}:
                return self._state_events(just_taken, "step_end", None)
        return self._state_events(self._take(entries), "step_end", None)

    def _end_step(
        self,
        *,
        cut_at: int | None = None,
        states: list[dict[str, Any]] | None = None,
        final: bool = False,
        setup: bool = False,
        trained: bool = False,
        boundary: str = "optimizer",
    ) -> None:
        self.active = True
        if states is None:
            states = self._end_states()
        before_end = list(states)
        if self._stats_source is not None and (
            final or (self.recorder.step + 1) % self.stats_every_steps == 0
        ):
            before_end.append(self._event("meta", what=PRODUCER_STATS_META, **self._stats_source(),
                                          **self.sampler.report()))
        fields: dict[str, Any] = {"phase": "end"}
        if self._snapshots and not setup and not self.sampled:
            fields["unsampled"] = True  # no parameter snapshots in this window, by sampling
        if setup:
            fields["setup"] = True
        if trained:
            fields["trained"] = True
            fields["boundary"] = boundary
        if final:
            fields["final"] = True
        end = self._event("step", **fields)
        begin = None if final else self._event("step", phase="begin")
        ended = self.recorder.step
        self.recorder.end_step(end, at=cut_at, before_end=before_end, next_begin=begin)
        self.sampler.step_ended(ended)
        self.cycle.step_ended()
        self._pending_end_states = []
        self._tail_start = None
        if not final and not setup:
            self.training_steps += 1
        # Names are re-read now and then, not every step (module swaps are rare and a
        # full walk of a large model is not free), and at once when they look stale.
        if self._snapshots and (self.registry.stale or self.training_steps % REFRESH_EVERY_STEPS == 1):
            self._refresh_names()

    def _refresh_names(self) -> None:
        with self._tls.own_work():
            self.registry.refresh()
            for entry in self.registry.all_entries():
                self.ownership.remember(entry.param)

    def finish(self, meta: dict[str, Any]) -> None:
        """Close the open window at session end: a pending first-iteration cut, then the tail."""
        if not self.active:
            return
        self._functional_backward()
        if not self.cycle.learnt and self.cycle.pending_cut is not None:
            self._end_step(
                cut_at=self.cycle.pending_cut, states=self._pending_end_states,
                trained=self.loop.window_ended(), boundary="optimizer",
            )
        setup = self.loop.in_setup
        trained = self.loop.window_ended()
        self.recorder.append(
            self._event(
                "meta", what=RUN_END_META, iterations=self.loop.iterations,
                optimizer_steps=self.loop.optimizer_steps, **meta,
            )
        )
        # The last iteration of a loop without an optimizer, or a process that never
        # trained, is judged on its parameters too; an optimizer run's tail is not.
        try:
            states = self._end_states() if (setup or trained) else []
        except Exception as exc:  # the window's events still go out, without the snapshot
            self.internal_error("final snapshot", exc)
            states = []
        self._end_step(states=states, final=True, setup=setup, trained=trained, boundary="close")
