"""Turns hook and wrapper callbacks into contract events for one process.

Everything the interception layer observes arrives here: module forward calls (to
find roots, stages and module events), optimizer steps (to end steps and snapshot
parameters), wrapped API calls.  The tracer owns the per-thread call stack (for
``parent`` links), the stage, and the step cycle; the `StepRecorder` owns batching.

Rules that keep training safe:

* every callback is guarded: an internal error is counted, reported once on stderr,
  and the user's call proceeds untouched;
* the tracer's own torch work (snapshots) runs with a per-thread ``busy`` flag so that
  it is never recorded as if the user had done it;
* inside ``torch.compile`` tracing nothing is recorded (said once on stderr).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

import torch

from invariants.events import (
    MODULE_FORWARD,
    MODULE_ZERO_GRAD,
    OPTIMIZER_STEP,
    OPTIMIZER_ZERO_GRAD,
    PARAMETER_VTYPE,
)

from .call_state import CallToken, ThreadState
from .contract_facts import ContractFacts
from .local_sgd import mark_locally_stepped
from .module_facts import FirstForwards, ParameterFree
from .param_snapshots import SnapshotMemo, snapshot_attrs
from .params import ParameterRegistry
from .recorder import StepRecorder
from .replicas import GradientSync
from .sampling import SnapshotSampler
from .ownership import ParameterOwnership, deliberate_reset
from .selection import Selection
from .stages import StageSwitching
from .forward_hooks import ForwardHooks
from .join_shadows import JoinShadows
from .stepping import StepBoundaries
from .summaries import summarize
from .workers import WorkerReports

SNAPSHOT_APIS = frozenset({OPTIMIZER_STEP, OPTIMIZER_ZERO_GRAD})


def is_compiling() -> bool:
    # Spelled exactly like this so that dynamo folds it to a constant while tracing.
    return torch.compiler.is_compiling()


class Tracer(StepBoundaries, ForwardHooks, StageSwitching, WorkerReports, JoinShadows):
    """Event production for one process (one rank, or one DataLoader worker)."""

    def __init__(
        self,
        recorder: StepRecorder,
        selection: Selection,
        *,
        sample_every: int = 1,
        overhead_budget: float | None = None,
        stats_every_steps: int = 50,
        stats_source: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.recorder = recorder
        self.selection = selection
        self.sampler = SnapshotSampler(sample_every, overhead_budget)
        self.stats_every_steps = max(int(stats_every_steps), 1)
        self._stats_source = stats_source
        self.registry = ParameterRegistry()
        self.ownership = ParameterOwnership()
        self.contracts = ContractFacts.create(self.ownership)
        self.replicas = GradientSync()
        self._memo = SnapshotMemo()
        self.stage = "init"
        self._explicit_stages: list[str] = []
        self._tls = ThreadState()
        self._cids = itertools.count(1)
        self.pid = os.getpid()
        self.enabled = True
        self.active = False  # anything beyond bookkeeping was recorded
        self.training_steps = 0  # windows ended before the final one, setup excluded
        self.internal_errors = 0
        self._reported: set[str] = set()
        self._root_ref: weakref.ref[torch.nn.Module] | None = None
        self._init_boundaries()
        self._record_forward = selection.wants(MODULE_FORWARD)
        self._snapshots = selection.snapshots
        self._autocast_devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        self._class_names: dict[type, tuple[str, str]] = {}
        self._first_forwards = FirstForwards()
        self._parameter_free = ParameterFree()
        self.recorder.append(self._event("step", phase="begin"))

    # -- small helpers --------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {
            "kind": kind,
            "t": time.time_ns(),
            "pid": self.pid,
            "tid": threading.get_native_id(),
            "stage": self.stage,
        }
        event.update(fields)
        return event

    def _ctx(self) -> dict[str, Any]:
        autocast = None
        for device in self._autocast_devices:
            if torch.is_autocast_enabled(device):
                autocast = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
                break
        root = self._root_ref() if self._root_ref is not None else None
        grad = torch.is_grad_enabled() or self._tls.checkpointed > 0
        ctx = {"grad": grad, "autocast": autocast, "training": bool(root.training) if root is not None else None}
        if not grad and root is not None and self.ownership.untrained(root, self.recorder.step):
            ctx["untrained_model"] = True  # a teacher or target network: no optimizer trains it
        if self.replicas.separate():
            ctx["separate"] = True  # `producers.replicas`
        return ctx

    def root_in_eval_mode(self) -> bool:
        root = self._root_ref() if self._root_ref is not None else None
        return root is not None and not root.training

    def _record(self, event: dict[str, Any]) -> None:
        self.active = True
        self.recorder.append(event)

    @property
    def sampled(self) -> bool:
        return self.sampler.wants(self.recorder.step)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Count an instrumentation bug and say so once per place; never re-raise."""
        self.internal_errors += 1
        if where in self._reported:
            return
        self._reported.add(where)
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        location = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
        print(f"trainwatch: internal error in {where}: {type(exc).__name__}: {exc}{location} "
              "(training continues; further errors are counted)", file=sys.stderr)

    def notice(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            print(f"trainwatch: {message}", file=sys.stderr)

    def skip_compiled(self) -> bool:
        if is_compiling():
            self.notice("compile", "inside torch.compile'd regions nothing is recorded (eager code is)")
            return True
        return False

    def checkpoint_entered(self) -> None:
        self._tls.checkpointed += 1

    def checkpoint_left(self) -> None:
        self._tls.checkpointed -= 1

    def cut_checkpoint_entered(self) -> bool:
        """A reentrant checkpoint block whose inputs need no gradient: inside a model's
        training forward (begun with gradients) its layers ran for training and will get
        no gradient (`producers.graph_cuts`); elsewhere it is an evaluation."""
        tls = self._tls
        if tls.depth == 0 or not tls.root_grad:
            return False
        tls.cut_checkpointed += 1
        return True

    def cut_checkpoint_left(self) -> None:
        self._tls.cut_checkpointed -= 1

    @property
    def busy(self) -> bool:
        return self._tls.busy

    @property
    def thread_groups(self) -> set[str]:
        """Groups of wrapped calls in progress on this thread."""
        return self._tls.groups

    def init_target_facts(self, tensor: Any) -> dict[str, bool]:
        """What an initialiser is about to destroy: ``trained``, its target was updated by
        training in this run; ``learned``, it holds learned values (trained, or loaded
        by ``Module.load_state_dict``)."""
        if isinstance(tensor, torch.Tensor):
            self.contracts.resumed_weights.initialised(tensor)
        param = self.ownership.parameter_of(tensor) if isinstance(tensor, torch.Tensor) else None
        if param is None:
            return {"trained": False, "learned": False}
        trained = self.ownership.is_trained(param)
        learned = trained or (self.ownership.holds_learned(param) and not deliberate_reset())
        return {"trained": trained, "learned": learned}

    def module_call_extra(self, module: torch.nn.Module, api: str) -> dict[str, Any]:
        """Fields of a call on a module: its type, flag and, for a model, which one."""
        extra: dict[str, Any] = {"mtype": type(module).__name__, "training": bool(module.training)}
        index = self.registry.root_index(module)
        if index is not None:
            extra["obj"] = f"m{index}"
        if api == MODULE_ZERO_GRAD:
            extra["clears"] = self.ownership.cleared_by(module)
        return extra

    # -- wrapped API calls ----------------------------------------------------------
    def enter_group(self, group: str) -> bool:
        """False when a call of ``group`` is already in progress on this thread."""
        groups = self._tls.groups
        if group in groups:
            return False
        groups.add(group)
        return True

    def leave_group(self, group: str) -> None:
        self._tls.groups.discard(group)

    def begin_call(
        self,
        api: str,
        name: str,
        args: dict[str, Any],
        *,
        extra: dict[str, Any] | None = None,
        stage: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        contract: dict[str, bool] | None = None,
    ) -> CallToken | None:
        """Record a ``pre`` event (and a parameter snapshot for optimizer calls);
        ``contract``: the API contracts evaluated on this call (`invariants.contract_apis.CONTRACTS`)."""
        try:
            self.loop_signal(api)
            token = CallToken(next(self._cids), api, name)
            if stage is not None and not self._explicit_stages:
                token.restore_stage = self.stage
                self.stage = stage
            stack = self._tls.stack
            ctx = self._ctx()
            if contract:
                ctx["contract"] = contract
            event = self._event(
                "call",
                name=name,
                api=api,
                phase="pre",
                cid=token.cid,
                parent=stack[-1] if stack else None,
                args={key: summarize(value, self.registry.name_of) for key, value in args.items()},
                ctx=ctx,
            )
            if extra:
                event.update(extra)
                self.note_clears(api, extra)
            self._record(event)
            stack.append(token.cid)
            if optimizer is not None and api in SNAPSHOT_APIS and self._snapshots and self.sampled \
                    and not self.leftover_grads_unshared(api):
                token.snapshot_of = optimizer
                if self.selection.wants_point(f"pre:{api}"):
                    token.pre_attrs = self._snapshot(
                        self.registry.optimizer_entries(optimizer), f"pre:{api}", token.cid,
                        data=api != OPTIMIZER_ZERO_GRAD,
                    )
            return token
        except Exception as exc:
            self.internal_error(f"recording {api}", exc)
            return None

    def end_call(self, token: CallToken | None, ret: Any = None, exc: BaseException | None = None) -> None:
        if token is None:
            return
        try:
            stack = self._tls.stack
            if stack and stack[-1] == token.cid:
                stack.pop()
            elif token.cid in stack:
                stack.remove(token.cid)
            if exc is None:
                event = self._event(
                    "call", name=token.name, api=token.api, phase="post", cid=token.cid,
                    ret=summarize(ret, self.registry.name_of),
                )
            else:
                event = self._event(
                    "call", name=token.name, api=token.api, phase="exc", cid=token.cid,
                    exc=type(exc).__qualname__, msg=str(exc)[:300],
                )
            self._record(event)
            if token.snapshot_of is not None and exc is None and self.selection.wants_point(f"post:{token.api}"):
                token.post_attrs = self._snapshot(
                    self.registry.optimizer_entries(token.snapshot_of), f"post:{token.api}", token.cid,
                    data=token.api != OPTIMIZER_ZERO_GRAD,
                )
        except Exception as error:
            self.internal_error(f"recording {token.api}", error)
        finally:
            if token.restore_stage is not None:
                self.stage = token.restore_stage

    # -- snapshots ------------------------------------------------------------------
    def _take(self, entries: list[Any], data: bool = True) -> list[tuple[Any, dict[str, Any]]]:
        started = time.perf_counter_ns()
        try:
            with self._tls.own_work():
                taken = snapshot_attrs(entries, data=data, memo=self._memo, defer=self.recorder.await_readback)
                roots = self.registry.roots()
                mark_locally_stepped(taken, roots)
                self.replicas.mark_unsynchronised(taken, roots)
            return taken
        finally:
            self.sampler.snapshot_taken(time.perf_counter_ns() - started)

    def _state_events(self, taken: list[tuple[Any, dict[str, Any]]], at: str, cid: int | None) -> list[dict[str, Any]]:
        # One snapshot is one instant: the header fields are read once, not per parameter.
        t, pid, tid, stage = time.time_ns(), self.pid, threading.get_native_id(), self.stage
        return [
            {
                "kind": "state", "t": t, "pid": pid, "tid": tid, "stage": stage,
                "name": entry.name, "vtype": PARAMETER_VTYPE, "at": at, "cid": cid, "attrs": attrs,
            }
            for entry, attrs in taken
        ]

    def _snapshot(
        self, entries: list[Any], at: str, cid: int | None, data: bool = True
    ) -> list[tuple[Any, dict[str, Any]]]:
        if not entries:
            return []
        taken = self._take(entries, data)
        self.recorder.extend(self._state_events(taken, at, cid))
        return taken

    def record_meta(self, what: str, **fields: Any) -> None:
        self.recorder.append(self._event("meta", what=what, **fields))

    def reset_after_fork(self) -> None:
        """A forked child (DataLoader worker) inherits our state: make it quiet and fresh."""
        self.enabled = False
        self.pid = os.getpid()
        self._tls = ThreadState()
        self._init_boundaries()
        self._memo = SnapshotMemo()
        self.active = False
        self.recorder.reset_after_fork()

