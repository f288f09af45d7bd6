"""Module forwards, seen through torch's global forward hooks: roots, stages, module events.

A mixin of `Tracer`.  These hooks run for every module call of the model, so they
build their events directly (no keyword plumbing) and memoise the per-class names.
The outermost module of a forward call is its root; a root that owns parameters is a
model, and only a model decides the stage (a loss module called at top level in a
validation loop is always in training mode) and marks a training iteration's start.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from invariants.events import MODULE_FORWARD

from .frozen_norms import keeps_frozen_statistics
from .module_facts import first_forward_context
from .stages import real_model, stage_of
from .summaries import summarize

#: `forward_post` called by torch after a forward that raised (no output exists)
_RAISED = object()


class ForwardHooks:
    """The global forward pre/post hooks of a `Tracer`."""

    def _forward_names(self, cls: type) -> tuple[str, str]:
        names = self._class_names.get(cls)
        if names is None:
            names = (f"{cls.__module__}.{cls.__qualname__}.forward", cls.__name__)
            self._class_names[cls] = names
        return names

    def forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        tls = self._tls
        if not self.enabled or tls.busy or self.skip_compiled():
            return
        try:
            depth = tls.depth
            tls.depth = depth + 1
            if depth == 0:
                tls.root_grad = torch.is_grad_enabled()
                if tls.root_grad:
                    self.contracts.wasted_grads.model_inputs(args)
                tls.root_paths = self.registry.add_root(module)
                if not self.replicas.shown:
                    self.replicas.is_replica((module,))  # a DDP wrapper is a replica from its first forward
                index = self.registry.root_index(module)
                tls.root_obj = None if index is None else f"m{index}"
                # Only roots with parameters (models) decide the stage: a loss module
                # called at top level in a validation loop is always in training mode.
                if self.registry.is_model_root(module):
                    model = real_model(module)
                    self._root_ref = weakref.ref(model)
                    self._set_auto_stage(stage_of(model, self.registry.roots(), self.ownership.optimizes_inputs_of))
                    if model.training and torch.is_grad_enabled():
                        self.contracts.autocast_cache.training_forward(self._autocast_devices)
                        if self.contracts.resumed_weights.looking:
                            with tls.own_work():  # fingerprints of freshly loaded weights
                                self.contracts.resumed_weights.training_forward_began(model)
                        self.root_forward_signal()
                elif self.registry.runs_swapped_out(module) and module.training and torch.is_grad_enabled():
                    self.root_forward_signal()  # a model under torch.func.functional_call
            if torch.is_grad_enabled() or tls.checkpointed or tls.cut_checkpointed:
                self.contracts.graph_cuts.ran(module)
            if "requires_grad" in module.__dict__:
                self.contracts.module_flags.forward(module)
            if not self._record_forward:
                tls.forward_cids.append(None)
                return
            cid = next(self._cids)
            stack = tls.stack
            name, mtype = self._forward_names(type(module))
            ctx = self._ctx()
            if self._parameter_free(module):
                # a parametrization (weight_norm, orthogonal) reshapes a weight, not a batch
                if not (args and isinstance(args[0], torch.nn.Parameter)):
                    ctx["no_params"] = True
            elif depth and ctx["grad"] and id(module) not in tls.root_paths and self.ownership.trains_none_of(module):
                # run inside a model that does not register it (layers kept in a plain
                # list), with trainable parameters no optimizer holds: never trained
                ctx["unregistered"] = True
            if module.training and ctx["grad"]:
                keeps = keeps_frozen_statistics(module, self.ownership.held_only_while_toggled_off,
                                                self.contracts.averaged_copies.is_average)
                if keeps is not None:
                    ctx["contract"] = {"frozen_norm_keeps_stats": keeps}
            elif not module.training and not ctx["grad"] and isinstance(module, _BatchNorm):
                with tls.own_work():  # reading its statistics is ours, not the user's
                    fitted = self.contracts.fitted_norms.evaluates_fitted_statistics(module)
                if fitted is not None:
                    ctx["contract"] = {"evaluates_fitted_norm": fitted}
            if self._first_forwards.is_first(module):
                with tls.own_work():  # its torch work (spectral-norm check) is ours, not the user's
                    ctx.update(first_forward_context(module))
            self._record(
                {
                    "kind": "call",
                    "t": time.time_ns(),
                    "pid": self.pid,
                    "tid": threading.get_native_id(),
                    "stage": self.stage,
                    "name": name,
                    "api": MODULE_FORWARD,
                    "phase": "pre",
                    "cid": cid,
                    "parent": stack[-1] if stack else None,
                    "module": tls.root_paths.get(id(module)),
                    "obj": tls.root_obj,
                    "mtype": mtype,
                    "training": module.training,
                    "args": {"0": summarize(args[0], self.registry.name_of)} if args else {},
                    "ctx": ctx,
                }
            )
            stack.append(cid)
            tls.forward_cids.append(cid)
        except Exception as exc:
            tls.forward_cids.append(None)
            self.internal_error("module forward pre-hook", exc)

    def forward_post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _RAISED
    ) -> None:
        """After a forward, or after a forward that raised: torch then calls always-called
        global hooks as ``hook(module, args, result)`` whatever ``with_kwargs`` says, so
        ``output`` is missing and the call is closed as ``phase: exc`` (the nesting depth
        and call stack must unwind, or every later forward of a program that caught the
        error would be taken for a submodule's)."""
        raised = output is _RAISED
        tls = self._tls
        if not self.enabled or tls.busy or torch.compiler.is_compiling():
            return
        try:
            if tls.depth > 0:
                tls.depth -= 1
                if tls.depth == 0 and self.contracts.resumed_weights.looking:
                    with tls.own_work():
                        self.contracts.resumed_weights.training_forward_ended()
            cid = tls.forward_cids.pop() if tls.forward_cids else None
            if cid is None:
                return
            stack = tls.stack
            if stack and stack[-1] == cid:
                stack.pop()
            name, mtype = self._forward_names(type(module))
            if raised:
                self._record({
                    "kind": "call", "t": time.time_ns(), "pid": self.pid, "tid": threading.get_native_id(),
                    "stage": self.stage, "name": name, "api": MODULE_FORWARD, "phase": "exc", "cid": cid,
                    "exc": "Exception", "msg": "raised in forward",
                })
                return
            event = {
                "kind": "call",
                "t": time.time_ns(),
                "pid": self.pid,
                "tid": threading.get_native_id(),
                "stage": self.stage,
                "name": name,
                "api": MODULE_FORWARD,
                "phase": "post",
                "cid": cid,
                "module": tls.root_paths.get(id(module)),
                "mtype": mtype,
                "training": module.training,
                "ret": summarize(output, self.registry.name_of),
            }
            if kwargs:
                # Global pre-hooks do not receive keyword arguments; the post hook does.
                name_of = self.registry.name_of
                event["kwargs"] = {key: summarize(value, name_of) for key, value in kwargs.items()}
            self._record(event)
        except Exception as exc:
            self.internal_error("module forward hook", exc)
