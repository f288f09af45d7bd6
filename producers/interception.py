"""Installing the interception points, each returning a handle that removes it.

Official, removable hooks first: the global optimizer step pre/post hooks (step
boundaries and snapshots) and the global module forward pre/post hooks (roots,
stages, module events).  Only APIs without a hook are wrapped, through
`producers.patching.patch_attribute`.  Torch functions are wrapped too when they have
a Python attribute to wrap (dropout, init); a ``TorchFunctionMode`` runs Python on *every*
tensor operation, so it is entered only for torch functions that cannot be wrapped, or ``--full``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from invariants.events import (
    AUTOGRAD_BACKWARD,
    BACKWARD_APIS,
    CLIP_GRAD_NORM,
    DATALOADER_EPOCH,
    GRAD_CLEAR_API,
    MODULE_EVAL,
    MODULE_FORWARD,
    MODULE_LOAD_STATE_DICT,
    MODULE_TRAIN,
    MODULE_ZERO_GRAD,
    OPTIMIZER_STEP,
    SCHEDULER_STEP,
    OPTIMIZER_ZERO_GRAD,
    PARAM_OVERWRITE,
    TENSOR_BACKWARD,
    WORKER_INIT_API,
    optimizer_id,
)

from .checkpoint_hooks import install_checkpoint_hooks
from .checkpoint_rng import patch_checkpoint_rng
from .clear_verdicts import CLEARING_CONTRACTS, clearing_contract
from .function_mode import ModeHandle, RecordingMode, mode_target, safe_resolve
from .identity_hooks import install_identity_hooks
from .script_hooks import patch_jit_script
from .worker_hooks import patch_worker_loop, patch_worker_start
from .patching import PatchHandle, patch_attribute
from .retained_graphs import keeps_graph
from .probabilities import install_probability_marks
from .loss_shapes import compares_like_shapes
from .functional_grads import patch_functional_grads
from .sampler_epochs import patch_dataloader_epochs
from .replica_batches import patch_batch_yields
from .stored_samples import patch_dataset_fetches
from .selection import COLLECTIVES, DROPOUT_FUNCTIONS, INIT_FUNCTIONS, LOSS_FUNCTIONS, Selection
from .tracer import Tracer, is_compiling


@dataclass(frozen=True)
class WrapSpec:
    """An API family and the attributes through which user code reaches it."""

    api: str
    targets: tuple[tuple[str, str], ...]  # (object path, attribute)
    method: bool = False  # first argument is ``self``: name the call by its runtime class
    group: str | None = None  # nested calls of the same group are not recorded again
    stage: str | None = None  # stage while the call runs


WRAP_SPECS: tuple[WrapSpec, ...] = (
    WrapSpec(OPTIMIZER_ZERO_GRAD, (("torch.optim.Optimizer", "zero_grad"),), method=True, group="zero_grad"),
    WrapSpec(MODULE_ZERO_GRAD, (("torch.nn.Module", "zero_grad"),), method=True, group="zero_grad"),
    WrapSpec(MODULE_TRAIN, (("torch.nn.Module", "train"),), method=True, group="module_mode"),
    WrapSpec(MODULE_EVAL, (("torch.nn.Module", "eval"),), method=True, group="module_mode"),
    WrapSpec(TENSOR_BACKWARD, (("torch.Tensor", "backward"),), method=True, group="backward"),
    # direct calls only: inside Tensor.backward the shared group suppresses it
    WrapSpec(AUTOGRAD_BACKWARD, (("torch.autograd", "backward"),), group="backward"),
    WrapSpec(
        CLIP_GRAD_NORM,
        (("torch.nn.utils", "clip_grad_norm_"), ("torch.nn.utils.clip_grad", "clip_grad_norm_")),
        group="clip",
    ),
    WrapSpec("torch.autocast.__enter__", (("torch.autocast", "__enter__"),), method=True, group="autocast"),
    WrapSpec("torch.save", (("torch", "save"), ("torch.serialization", "save")), group="save", stage="checkpoint"),
    WrapSpec(
        SCHEDULER_STEP,
        (("torch.optim.lr_scheduler.LRScheduler", "step"),),
        method=True,
        group="lr_scheduler",
    ),
    WrapSpec("torch.manual_seed", (("torch", "manual_seed"), ("torch.random", "manual_seed")), group="seed"),
    *(WrapSpec(api, (("torch.nn.functional", api.rsplit(".", 1)[1]),), group="dropout") for api in DROPOUT_FUNCTIONS),
    *(WrapSpec(api, (("torch.nn.init", api.rsplit(".", 1)[1]),), group="init") for api in INIT_FUNCTIONS),
    *(WrapSpec(api, (("torch.nn.functional", api.rsplit(".", 1)[1]),), group="loss") for api in LOSS_FUNCTIONS),
    *(
        WrapSpec(
            api,
            (("torch.distributed", api.rsplit(".", 1)[1]), ("torch.distributed.distributed_c10d", api.rsplit(".", 1)[1])),
            group="collective",
        )
        for api in COLLECTIVES
    ),
)
WRAPPED_APIS = frozenset(spec.api for spec in WRAP_SPECS)
#: recorded by hooks or by wrappers with their own logic (`producers.identity_hooks`)
HOOKED_APIS = frozenset({OPTIMIZER_STEP, MODULE_FORWARD, WORKER_INIT_API, PARAM_OVERWRITE, MODULE_LOAD_STATE_DICT,
                         DATALOADER_EPOCH})
INIT_PROCESS_GROUP = "torch.distributed.init_process_group"


def _signature(function: Callable[..., Any]) -> tuple[list[str], dict[str, bool]]:
    """Positional parameter names, and the mode flags (``training``) with their defaults.

    A flag left to its default is still the mode the call ran in: ``F.dropout(x, p)``
    drops in evaluation too, because ``training`` defaults to ``True``.  Recording only
    what the caller wrote would hide exactly that mistake, so defaults of mode flags are
    recorded as if passed.  Other defaults (hyperparameters) are not: they are no law.
    """
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return [], {}
    positional = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    flags = {p.name: p.default for p in parameters if p.name in MODE_FLAGS and isinstance(p.default, bool)}
    return positional, flags


#: arguments that say which mode a functional call runs in
MODE_FLAGS = frozenset({"training"})


#: the contract a gradient clear carries (`producers.wasted_grads`), by the API that clears

#: APIs whose calls shape windows and stages: wrapped even when not recorded
BOUNDARY_APIS = frozenset(
    {OPTIMIZER_ZERO_GRAD, MODULE_ZERO_GRAD, MODULE_TRAIN, MODULE_EVAL, *BACKWARD_APIS}
)
MODE_APIS = frozenset({MODULE_TRAIN, MODULE_EVAL})


def _make_call_wrapper(
    tracer: Tracer, spec: WrapSpec, on_post: Callable[[], None] | None, record: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        names, flag_defaults = _signature(original)
        function_name = f"{getattr(original, '__module__', None) or spec.api.rsplit('.', 1)[0]}.{getattr(original, '__qualname__', spec.api)}"
        method_suffix = spec.api.rsplit(".", 1)[1]
        group = spec.group
        switches_mode = spec.api in MODE_APIS
        left_out_without_backward = spec.api == CLIP_GRAD_NORM  # see `producers.trainer_passes`
        keeps_backward_graph = spec.api in BACKWARD_APIS
        collective = group == "collective"

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not tracer.enabled or tracer.busy or (group is not None and not tracer.enter_group(group)):
                return original(*args, **kwargs)
            try:
                if tracer.skip_compiled():
                    return original(*args, **kwargs)
                if left_out_without_backward:
                    if tracer.left_out.clip():
                        return original(*args, **kwargs)
                    args, kwargs = tracer.contracts.clip_bounds.clip_called(args, kwargs)
                token = None
                try:
                    if keeps_backward_graph:
                        tracer.backward_keeps_graph = keeps_graph(args, kwargs)
                    elif collective:
                        tracer.replicas.collective_called(spec.api, tracer.backward_pending,
                                                          args[0] if args else kwargs.get("tensor"))
                    if record:
                        token = _begin(tracer, spec, args, kwargs, names, flag_defaults, function_name, method_suffix)
                    else:
                        tracer.loop_signal(spec.api)
                except Exception as exc:
                    tracer.internal_error(f"wrapper of {spec.api}", exc)
                try:
                    result = original(*args, **kwargs)
                except BaseException as exc:
                    tracer.end_call(token, exc=exc)
                    raise
                tracer.end_call(token, result)
                try:
                    if left_out_without_backward:
                        tracer.contracts.clip_returned(result)
                    if switches_mode and args:
                        tracer.mode_switched(args[0])
                    if on_post is not None:
                        on_post()
                except Exception as exc:
                    tracer.internal_error(f"after {spec.api}", exc)
                return result
            finally:
                if group is not None:
                    tracer.leave_group(group)

        return wrapper

    return make


def _begin(
    tracer: Tracer, spec: WrapSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
    names: list[str], flag_defaults: dict[str, bool], function_name: str, method_suffix: str,
) -> Any:
    """The ``pre`` event of a wrapped call, with what identifies its receiver."""
    call_args = {names[i] if i < len(names) else str(i): value for i, value in enumerate(args)}
    call_args.update(kwargs)
    for flag, default in flag_defaults.items():
        call_args.setdefault(flag, default)
    extra = None
    optimizer = None
    contract = None
    if spec.api in BACKWARD_APIS and not tracer.in_optimizer_step:  # a closure's backward is the step's own
        roots = args[0] if args else kwargs.get("tensors")
        tracer.contracts.accumulation.backward(roots)
        tracer.contracts.unstepped.backward(roots, tracer.ownership.held_elsewhere)
        if tracer.contracts.foreign_grads.waiting and tracer.ownership.several_optimizers():
            tracer.contracts.foreign_grads.backward_begins(tracer.ownership.live_optimizers())
    if spec.api in BACKWARD_APIS and tracer.stage == "eval" and _trains_nothing(tracer.ownership.optimized_parameters()):
        extra = {"trained": False}  # gradients of inputs alone (Langevin sampling, an attack on a frozen model)
    if spec.api == CLIP_GRAD_NORM:
        contract = {"unscaled_grads": not tracer.contracts.loss_scale.scaled}
        tracer.contracts.wasted_grads.inspected()
    if spec.method and args:
        cls = type(args[0])
        name = f"{cls.__module__}.{cls.__qualname__}.{method_suffix}"
        if isinstance(args[0], torch.nn.Module):
            extra = tracer.module_call_extra(args[0], spec.api)
        elif isinstance(args[0], torch.optim.Optimizer):
            optimizer = args[0]
            index = tracer.registry.add_optimizer(optimizer)
            tracer.ownership.optimizer_seen(optimizer, index)
            extra = {"obj": optimizer_id(index)}
        elif isinstance(args[0], torch.autocast):
            call_args.update(_autocast_args(args[0]))
        if spec.api in CLEARING_CONTRACTS:
            contract = clearing_contract(tracer, spec.api, extra or {}, optimizer)
        elif spec.api == TENSOR_BACKWARD:
            judged = {"compares_like_shapes": compares_like_shapes(args[0]),
                      "clears_between_evaluations": tracer.contracts.closure_clears.clears_between_evaluations()}
            contract = {name: verdict for name, verdict in judged.items() if verdict is not None} or None
        elif spec.api == SCHEDULER_STEP:
            tracer.contracts.schedule_cadence.scheduler_stepped(args[0])
            tracer.contracts.schedule_targets.scheduler_stepped(args[0])
            tracer.contracts.schedule_horizons.scheduler_stepped(args[0])
            judged = {
                "resumes_schedule": tracer.contracts.schedule_resumes.resumes_schedule(args[0]),
                "steps_once_per_epoch": tracer.contracts.epoch_schedules.steps_once_per_epoch(args[0], args, kwargs),
            }
            contract = {name: verdict for name, verdict in judged.items() if verdict is not None} or None
    else:
        name = function_name
        if spec.api in INIT_FUNCTIONS and args:
            extra = tracer.init_target_facts(args[0])
    return tracer.begin_call(spec.api, name, call_args, extra=extra, stage=spec.stage, optimizer=optimizer,
                             contract=contract)


def _trains_nothing(optimized: list[torch.Tensor]) -> bool:
    """Optimizers exist and none of their parameters takes a gradient now."""
    return bool(optimized) and not any(param.requires_grad for param in optimized)


def _autocast_args(context: Any) -> dict[str, Any]:
    """What an autocast region asks for (the object itself summarises to nothing useful)."""
    dtype = getattr(context, "fast_dtype", None)
    return {
        "device_type": getattr(context, "device", None),
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "enabled": bool(getattr(context, "_enabled", True)),
    }


def install(tracer: Tracer, selection: Selection, on_rank_change: Callable[[], None]) -> list[Any]:
    """Install every interception point the selection needs; return their handles."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    clock = tracer.sampler.clock  # with an overhead budget: every hook's time is measured
    timed = clock.timed if clock is not None else (lambda hook: hook)
    if clock is not None:
        tracer.begin_call, tracer.end_call = timed(tracer.begin_call), timed(tracer.end_call)
    handles: list[Any] = [
        register_optimizer_step_pre_hook(timed(tracer.optimizer_pre)),
        register_optimizer_step_post_hook(timed(tracer.optimizer_post)),
        register_module_forward_pre_hook(timed(tracer.forward_pre)),
        register_module_forward_hook(timed(tracer.forward_post), with_kwargs=True, always_call=True),
    ]
    for spec in WRAP_SPECS:
        wanted = selection.wants(spec.api)
        on_post = on_rank_change if spec.api == INIT_PROCESS_GROUP else None
        if not wanted and on_post is None and spec.api not in BOUNDARY_APIS:
            continue
        if spec.api.startswith("torch.distributed.") and not torch.distributed.is_available():
            continue
        for owner_path, attr in spec.targets:
            owner = safe_resolve(owner_path)
            if owner is None or not hasattr(owner, attr):
                continue
            handles.append(patch_attribute(owner, attr, _make_call_wrapper(tracer, spec, on_post, record=wanted)))
    handles.extend(install_identity_hooks(tracer, record_writes=selection.wants(PARAM_OVERWRITE),
                                          record_clears=selection.wants(GRAD_CLEAR_API)))
    handles += [*install_checkpoint_hooks(tracer), patch_worker_loop(tracer), patch_worker_start(tracer)]
    handles += tracer.install_join_shadows()
    if any(selection.wants(api) for api in LOSS_FUNCTIONS):
        handles += install_probability_marks(is_compiling)
    if selection.wants(CLIP_GRAD_NORM) or selection.wants(OPTIMIZER_STEP):
        handles += tracer.contracts.loss_scale.install(tracer.contracts.accumulation.loss_scaled)
    if selection.wants(OPTIMIZER_STEP):
        handles += [patch_batch_yields(tracer), patch_dataset_fetches(tracer),
                    tracer.contracts.autocast_cache.install(), *tracer.contracts.averaged_copies.install(),
                    *patch_checkpoint_rng(tracer)]
    if selection.wants(SCHEDULER_STEP):
        handles += tracer.contracts.schedule_resumes.install()
    if selection.wants(DATALOADER_EPOCH) or selection.wants(SCHEDULER_STEP):
        handles.append(patch_dataloader_epochs(tracer, judge_samplers=selection.wants(DATALOADER_EPOCH)))
    handles += patch_functional_grads(tracer)
    handles.append(patch_jit_script(list(handles)))
    mode_targets = _mode_targets(selection)
    if selection.full or mode_targets:
        wrapped = frozenset(
            fn for h in handles if isinstance(h, PatchHandle) for fn in (h.original, h.replacement)
        )
        mode = RecordingMode(tracer, None if selection.full else frozenset(mode_targets), wrapped)
        mode.__enter__()
        handles.append(ModeHandle(mode))
    return handles


def _mode_targets(selection: Selection) -> list[Any]:
    """Selected torch functions that no wrapper or hook covers (e.g. from an invariants file).

    Only functions a ``TorchFunctionMode`` can see qualify: ``torch.*`` and
    ``torch.nn.functional.*`` functions and ``torch.Tensor`` methods, not methods of
    other classes (``Optimizer.step`` and ``Module.forward`` come from hooks).
    """
    targets = []
    for api in selection.apis - WRAPPED_APIS - HOOKED_APIS:
        target = mode_target(api)
        if target is not None:
            targets.append(target)
    return targets


def recordable(api: str) -> bool:
    """Whether some interception point records calls of the family ``api``."""
    return api in WRAPPED_APIS or api in HOOKED_APIS or mode_target(api) is not None
